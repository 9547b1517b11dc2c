"""Peers' rules restated as test oracles, each citing where it comes from (no peer code copied).

Search-R1 is not on PyPI, so its rules are written out here from PeterGriffinJin/Search-R1 at
a14dc3a4 (the commit ../shared/data/SOURCES.md names). FlashRAG's metrics and the official GAIA
scorer are installed test dependencies (requirements-nodeps.txt) and used as they ship.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any


# ---------------------------------------------------------------- Search-R1 observation
def search_r1_passages(contents: list[str]) -> str:
    """`search_r1/llm_agent/generation.py` `_passages2string`: for passage i (from 1), the title is
    `contents.split("\\n")[0]` as it stands and the text is the other lines re-joined with "\\n";
    each passage is the line `Doc {i}(Title: {title}) {text}` ended by one "\\n"."""
    out = []
    for i, c in enumerate(contents, start=1):
        lines = c.split("\n")
        out.append("Doc " + str(i) + "(Title: " + lines[0] + ") " + "\n".join(lines[1:]) + "\n")
    return "".join(out)


def search_r1_search_observation(contents: list[str]) -> str:
    """`execute_predictions`: a search's next observation is the passages string, `.strip()`ped,
    between `<information>` tags with two newlines on each side."""
    return "\n\n<information>" + search_r1_passages(contents).strip() + "</information>\n\n"


# `execute_predictions`: the observation after a turn with no valid search/answer action.
SEARCH_R1_INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)


# ---------------------------------------------------------------- Search-R1 qa_em.py
def search_r1_normalize(s: str) -> str:
    """`verl/utils/reward_score/qa_em.py` `normalize_answer`: lowercase, remove every
    `string.punctuation` character, replace the whole words a/an/the by a space, then collapse
    whitespace (split and re-join with single spaces)."""
    s = s.lower()
    s = "".join(c for c in s if c not in string.punctuation)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _as_list(golds) -> list[str]:
    # qa_em.py: `if isinstance(golden_answers, str): golden_answers = [golden_answers]`
    return [golds] if isinstance(golds, str) else list(golds)


def search_r1_em(prediction: str, golds) -> int:
    """`em_check`: 1 when some normalized gold equals the normalized prediction."""
    p = search_r1_normalize(prediction)
    return int(any(search_r1_normalize(g) == p for g in _as_list(golds)))


def search_r1_subem(prediction: str, golds) -> int:
    """`subem_check`: 1 when some normalized gold is a substring of the normalized prediction
    (so a gold normalizing to "" always scores 1)."""
    p = search_r1_normalize(prediction)
    return int(any(search_r1_normalize(g) in p for g in _as_list(golds)))


def search_r1_retrieval_correct(text: str, golds) -> bool:
    """`qa_em_format.py` `is_retrieval_correct`: some normalized gold inside one normalized,
    stripped `<information>` block."""
    blocks = [b.strip() for b in re.findall(r"<information>(.*?)</information>", text, re.DOTALL)]
    return any(search_r1_normalize(g) in search_r1_normalize(b) for b in blocks for g in _as_list(golds))


# ---------------------------------------------------------------- official GAIA scorer
GAIA_SCORER_FUNCTIONS = ("normalize_number_str", "split_string", "question_scorer", "normalize_str")


def official_gaia_question_scorer() -> Callable[[str, str], tuple[bool, str]] | None:
    """The leaderboard's `question_scorer` exactly as `inspect-evals` ships it, or None when that
    package is not installed.

    `inspect_evals.gaia` imports all of `inspect_ai` (boto3, fastapi, textual, ...) on import,
    far too heavy for a test dependency, so the package is installed with `--no-deps` and only the
    four plain functions of its `gaia/scorer.py` (stdlib `re`, `string` and a logger) are compiled
    from the installed file: the scorer's own code, none of the rest.
    """
    spec = importlib.util.find_spec("inspect_evals")  # a top-level spec: runs no package code
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "gaia" / "scorer.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in GAIA_SCORER_FUNCTIONS]
    if sorted(f.name for f in funcs) != sorted(GAIA_SCORER_FUNCTIONS):
        raise AssertionError(f"{path} no longer defines {GAIA_SCORER_FUNCTIONS}")
    logger = logging.getLogger("official_gaia_scorer")
    logger.disabled = True  # it warns on every non-number prediction
    namespace: dict[str, Any] = {"re": re, "string": string, "Any": Any, "logger": logger}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace["question_scorer"]
