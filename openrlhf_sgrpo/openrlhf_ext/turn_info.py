"""The agent's per-turn ``Experience.info`` slots as tensors: what CalibAdv reads besides advantages.

The agent (``agent_env``) writes each rollout's turns into fixed ``turn{k}_*`` info slots (the
contract lives in :mod:`agent_env.info_keys`). The OpenRLHF hook, the local runner's experience
maker and the rollout records all read them through :func:`turn_tensors`, which imports nothing
of theirs, so none of them imports another to get it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from agent_env import info_keys as K

# OpenRLHF's action_mask column j is sequence token j + 1 (``action_mask = mask[1:]``).
TOKEN_TO_COLUMN_SHIFT = 1


def _count_slots(info: Mapping[str, Any], key_fn) -> int:
    n = 0
    while key_fn(n) in info:
        n += 1
    return n


def _column(info: Mapping[str, Any], key: str) -> torch.Tensor:
    if key not in info:
        raise KeyError(f"CalibAdv needs Experience.info[{key!r}] from the agent "
                       f"(agent_env.openrlhf_agent); available keys: {sorted(info)[:20]}...")
    return torch.as_tensor(info[key]).reshape(-1)


def turn_tensors(info: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """One experience's per-turn slots as [b, T] / [b, T, D] tensors (token ranges as columns),
    plus the agent's per-turn think similarity, F1 and format verdict: every input CalibAdv
    takes besides the advantages, by the names :func:`calibadv_token_advantages` uses."""
    num_turns = _count_slots(info, K.turn_kind_key)
    num_docs = _count_slots(info, lambda j: K.turn_doc_key(0, j))
    if num_turns == 0:
        raise KeyError(f"CalibAdv needs the agent's per-turn info ({K.turn_kind_key(0)!r}, ...); "
                       f"run the agent from agent_env.openrlhf_agent (--train.agent_func_path)")
    stack = lambda key_fn: torch.stack([_column(info, key_fn(k)).long() for k in range(num_turns)], -1)
    kind, start, end = stack(K.turn_kind_key), stack(K.turn_start_key), stack(K.turn_end_key)
    present = start != K.PAD
    shift = TOKEN_TO_COLUMN_SHIFT
    start = torch.where(present, start - shift, start)
    end = torch.where(present, end - shift, end)
    if num_docs:
        docs = torch.stack([torch.stack([_column(info, K.turn_doc_key(k, j)).long() for j in range(num_docs)], -1)
                            for k in range(num_turns)], 1)
    else:
        docs = torch.full((*kind.shape, 1), K.PAD, dtype=torch.long)
    think_sim = torch.stack([_column(info, K.turn_think_sim_key(k)).float() for k in range(num_turns)], -1)
    return {"turn_kind": kind, "turn_start": start, "turn_end": end, "doc_ids": docs, "think_sim": think_sim,
            "f1": _column(info, K.F1).float(), "format_ok": _column(info, K.FORMAT_OK) > 0}
