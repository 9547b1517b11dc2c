"""The wire contract of ``/retrieve`` and ``/search`` (Search-R1's), in one place.

Request: ``{"queries": [str], "topk": int?, "return_scores": bool?}``.
Response with scores: ``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}``;
without: ``{"result": [[{"id", "contents"}, ...], ...]}``.
Search-R1's client sends ``{"queries": [...], "topk": 3, "return_scores": true}`` — also with an
empty ``queries`` list when no rollout searched in a turn, which must answer ``{"result": []}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class BadRequest(ValueError):
    """Client error: becomes HTTP 400 ``{"error": message}``."""


@dataclass(frozen=True)
class Limits:
    default_topk: int = 3
    max_topk: int = 100
    # Search-R1's trainer posts every active rollout's query of a turn in one request:
    # train_batch_size 512 × n_agent 5 = 2,560 queries at its defaults.
    max_queries: int = 4096
    allow_empty_queries: bool = True  # Search-R1's client posts [] when no rollout searched


EXAMPLE = '{"queries": ["..."], "topk": 3}'


def decode_body(data: bytes) -> Any:
    """The request body as JSON; anything that is not (bad UTF-8, nesting deeper than the parser
    recurses) is a :class:`BadRequest`, never a 500."""
    try:
        return json.loads(data)
    except RecursionError:
        raise BadRequest("request body is JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise BadRequest(f"request body must be JSON, e.g. {EXAMPLE} ({str(e)[:100]})") from None


def _brief(value: Any) -> str:
    """A client's value for an error message: scalars shown (cut), containers only by type, so a
    message never recurses into (or echoes) a huge or deeply nested value."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)[:50]
    if isinstance(value, str):
        return repr(value[:50])
    return f"a {type(value).__name__}"


@dataclass(frozen=True)
class SearchRequest:
    queries: list[str]
    topk: int
    return_scores: bool


def _clean(q: str) -> str:
    """Lone surrogates (valid JSON escapes, invalid UTF-8) would crash tokenizers: replace them."""
    return q.encode("utf-8", "replace").decode("utf-8")


def parse_request(body: Any, limits: Limits) -> SearchRequest:
    """Validate a decoded JSON body; raises :class:`BadRequest` naming the offending field."""
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object like {EXAMPLE}")
    if "queries" not in body:
        raise BadRequest("missing field 'queries' (a list of strings)")
    queries = body["queries"]
    if not isinstance(queries, list):
        raise BadRequest(f"'queries' must be a list of strings, got {type(queries).__name__}")
    if not queries and not limits.allow_empty_queries:
        raise BadRequest("'queries' is empty")
    if len(queries) > limits.max_queries:
        raise BadRequest(f"{len(queries)} queries in one request; the maximum is {limits.max_queries}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(f"queries[{i}] must be a string, got {type(q).__name__}")
    topk = body.get("topk")
    if topk is None:
        topk = limits.default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise BadRequest(f"'topk' must be an integer, got {_brief(topk)}")
    if not 1 <= topk <= limits.max_topk:
        raise BadRequest(f"'topk' must be between 1 and {limits.max_topk}, got {_brief(topk)}")
    rs = body.get("return_scores", False)
    if rs is None:
        rs = False
    if not isinstance(rs, bool):
        raise BadRequest(f"'return_scores' must be true or false, got {_brief(rs)}")
    return SearchRequest([_clean(q) for q in queries], topk, rs)


def format_result(docs: Sequence[Sequence[dict[str, str]]], scores: Sequence[Sequence[float]],
                  return_scores: bool) -> dict[str, Any]:
    """Search-R1's response body for per-query document lists (and their scores)."""
    if return_scores:
        return {"result": [[{"document": d, "score": float(s)} for d, s in zip(ds, ss)]
                           for ds, ss in zip(docs, scores)]}
    return {"result": [list(ds) for ds in docs]}
