"""CalibAdv in OpenRLHF's experience maker: ``Experience.info`` scalars -> tensors -> calibadv.

The agent (``agent_env``) writes each rollout's turns into fixed ``turn{k}_*`` info slots (the
contract lives in :mod:`agent_env.info_keys`). After any group estimator has produced token
advantages, :func:`apply_calibadv` gathers those slots for the whole batch, puts rows in prompt
order, converts token ranges to advantage columns, runs :func:`openrlhf_sgrpo.calibadv.
calibadv_token_advantages` and writes the calibrated advantages back per experience.
"""

from __future__ import annotations

from typing import Any

import torch

from openrlhf_sgrpo.calibadv import CalibAdvConfig, calibadv_token_advantages
from openrlhf_sgrpo.openrlhf_ext.batch_order import ADVANTAGE_INFO_KEY, batch_order, prompt_ordered
from openrlhf_sgrpo.openrlhf_ext.turn_info import turn_tensors


def calibadv_config_from_args(args: Any) -> CalibAdvConfig | None:
    """CalibAdv settings from ``args.algo.calibadv``; None when disabled or absent."""
    ns = getattr(getattr(args, "algo", None), "calibadv", None)
    if ns is None or not getattr(ns, "enable", False):
        return None
    defaults = CalibAdvConfig()
    return CalibAdvConfig(**{name: getattr(ns, name, getattr(defaults, name))
                             for name in CalibAdvConfig.__dataclass_fields__})


def _pad_cols(t: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def apply_calibadv(experiences: list, args: Any) -> dict[str, float]:
    """Calibrate ``experience.advantages`` in place when ``--algo.calibadv.enable``; return stats."""
    cfg = calibadv_config_from_args(args)
    if cfg is None or not experiences:
        return {}
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
