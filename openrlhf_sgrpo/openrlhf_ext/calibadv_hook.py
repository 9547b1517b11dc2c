"""CalibAdv in OpenRLHF's experience maker: ``Experience.info`` scalars -> tensors -> calibadv.

The agent (``agent_env``) writes each rollout's turns into fixed ``turn{k}_*`` info slots (the
contract lives in :mod:`agent_env.info_keys`). After any group estimator has produced token
advantages, :func:`apply_calibadv` gathers those slots for the whole batch, puts rows in prompt
order, converts token ranges to advantage columns, runs :func:`openrlhf_sgrpo.calibadv.
calibadv_token_advantages` and writes the calibrated advantages back per experience.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from agent_env import info_keys as K
from openrlhf_sgrpo.calibadv import CalibAdvConfig, calibadv_token_advantages

# OpenRLHF's action_mask column j is sequence token j + 1 (``action_mask = mask[1:]``).
TOKEN_TO_COLUMN_SHIFT = 1


def calibadv_config_from_args(args: Any) -> CalibAdvConfig | None:
    """CalibAdv settings from ``args.algo.calibadv``; None when disabled or absent."""
    ns = getattr(getattr(args, "algo", None), "calibadv", None)
    if ns is None or not getattr(ns, "enable", False):
        return None
    defaults = CalibAdvConfig()
    return CalibAdvConfig(**{name: getattr(ns, name, getattr(defaults, name))
                             for name in CalibAdvConfig.__dataclass_fields__})


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


def _pad_cols(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def apply_calibadv(experiences: list, args: Any) -> dict[str, float]:
    """Calibrate ``experience.advantages`` in place when ``--algo.calibadv.enable``; return stats."""
    cfg = calibadv_config_from_args(args)
    if cfg is None or not experiences:
        return {}
    from openrlhf_sgrpo.openrlhf_ext.experience_maker import ADVANTAGE_INFO_KEY, batch_order, prompt_ordered

    width = max(e.advantages.shape[1] for e in experiences)
    per_exp = [turn_tensors(e.info) for e in experiences]
    turns = {name: prompt_ordered(experiences, [t[name] for t in per_exp]) for name in per_exp[0]}
    advantages = prompt_ordered(experiences, [_pad_cols(e.advantages, width) for e in experiences])
    mask = prompt_ordered(experiences, [_pad_cols(e.action_mask.long(), width) for e in experiences]).bool()
    rollout_adv = None
    if all(ADVANTAGE_INFO_KEY in e.info for e in experiences):
        rollout_adv = prompt_ordered(experiences, [torch.as_tensor(e.info[ADVANTAGE_INFO_KEY]).reshape(-1)
                                                   for e in experiences])
    new_adv, stats = calibadv_token_advantages(
        advantages, group_size=args.rollout.n_samples_per_prompt, action_mask=mask,
        rollout_advantage=rollout_adv, config=cfg, **turns)
    for e, adv in zip(experiences, batch_order(experiences, new_adv)):
        e.advantages = adv[:, : e.advantages.shape[1]].to(e.advantages.dtype)
        for name, value in stats.items():
            e.info[name] = torch.full((adv.shape[0],), float(value))
    return stats
