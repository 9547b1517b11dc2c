"""Strata keys: turn per-sample info scalars (tool_calls, search_calls, ...) into int64 ids.

The agent writes cumulative integer counts into ``extra_logs``; OpenRLHF stores each as a
``[B]`` tensor in ``Experience.info``. A stratum is either one count (``"tool_calls"``), an
optionally capped count (counts >= cap merge, useful when long tails leave singleton strata),
or a per-tool *signature* such as ``("search_calls", "code_calls")`` combined into one id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

DEFAULT_STRATIFY_BY = "tool_calls"
EMITTING_AGENT = "agent_env.openrlhf_agent.AgentExecutor (loaded with --train.agent_func_path)"


def parse_stratify_by(spec: str | Sequence[str]) -> tuple[str, ...]:
    """'tool_calls' -> ('tool_calls',); 'search_calls,code_calls' -> a signature key."""
    keys = tuple(k.strip() for k in (spec.split(",") if isinstance(spec, str) else spec))
    if not keys or any(not k for k in keys):
        raise ValueError(f"stratify_by must name one or more info keys (comma-separated), got {spec!r}")
    return keys


def _as_counts(info: Mapping[str, Any], key: str) -> torch.Tensor:
    if key not in info:
        raise KeyError(
            f"Experience.info has no {key!r} to stratify by: the agent must emit it in extra_logs "
            f"(ours is {EMITTING_AGENT}); available keys: {sorted(info)}")
    values = torch.as_tensor(info[key]).reshape(-1)
    if values.is_floating_point():
        if not bool(torch.isfinite(values).all()) or not bool((values == values.round()).all()):
            raise ValueError(f"info[{key!r}] must hold integer counts, got {values.tolist()[:8]}...")
    values = values.to(torch.int64)
    if bool((values < 0).any()):
        raise ValueError(f"info[{key!r}] must hold non-negative counts, got min {int(values.min())}")
    return values


def strata_from_info(info: Mapping[str, Any], key: str | Sequence[str] = DEFAULT_STRATIFY_BY,
                     cap: int | None = None) -> torch.Tensor:
    """Per-sample int64 stratum ids from integer info keys.

    With several keys the capped counts are combined in mixed radix, so every distinct
    (search_calls, code_calls) pair gets its own id. Ids only need to be consistent within one
    batch: strata are compared inside a prompt group, never across batches.
    """
    if cap is not None and (not isinstance(cap, int) or cap < 1):
        raise ValueError(f"strata cap must be a positive int or None, got {cap!r}")
    keys = parse_stratify_by(key)
    ids: torch.Tensor | None = None
    for k in keys:
        counts = _as_counts(info, k)
        if cap is not None:
            counts = counts.clamp_max(cap)
        if ids is None:
            ids = counts
            continue
        if counts.shape != ids.shape:
            raise ValueError(f"info[{k!r}] has {counts.numel()} values, expected {ids.numel()}")
        radix = (cap + 1) if cap is not None else int(counts.max()) + 1
        ids = ids * radix + counts
    assert ids is not None
    return ids
