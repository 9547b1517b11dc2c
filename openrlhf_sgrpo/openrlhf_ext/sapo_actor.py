"""SAPO inside OpenRLHF's actor: wrap ``PolicyLoss`` and surface the term's stats in the log.

OpenRLHF 0.11.2 builds ``self.actor_loss_fn = PolicyLoss(...)`` in ``ActorPPOTrainer.__init__``
(inside the Ray actor worker) and calls it once per micro-batch in ``training_step``. We wrap
both methods, once per process (:func:`install_sapo_patch`, run by our ``PolicyModelActor`` in
its own process, see :mod:`openrlhf_sgrpo.openrlhf_ext.actors`):

- ``__init__``: when ``args.algo.sapo.enable``, the built loss is wrapped by :class:`SAPOPolicyLoss`,
  which adds the SAPO term (``openrlhf_sgrpo.sapo``) aggregated with OpenRLHF's own
  ``aggregate_loss`` and the same loss-batch normalization as the policy loss.
- ``training_step``: the loss fn cannot reach ``experience.info``, so it keeps its last stats and
  the wrapper adds them to the returned metrics as 0-dim tensors, which ``ppo_train`` reduces
  token-weighted like ``policy_loss``.

A run without ``--algo.sapo.enable`` keeps OpenRLHF's loss object untouched.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from openrlhf_sgrpo.sapo import (
    DEFAULT_COEF,
    DEFAULT_ESTIMATOR,
    DEFAULT_RATIO_THRESHOLD,
    SAPOConfig,
    sapo_loss,
)

_PATCH_MARK = "_sgrpo_sapo_patched"


def sapo_config_from_args(args: Any) -> SAPOConfig | None:
    """SAPO settings from the run's args, or None when disabled or the flags are absent."""
    sapo = getattr(getattr(args, "algo", None), "sapo", None)
    if sapo is None or not getattr(sapo, "enable", False):
        return None
    return SAPOConfig(coef=float(getattr(sapo, "coef", DEFAULT_COEF)),
                      ratio_threshold=float(getattr(sapo, "ratio_threshold", DEFAULT_RATIO_THRESHOLD)),
                      estimator=getattr(sapo, "estimator", DEFAULT_ESTIMATOR))


class SAPOPolicyLoss(nn.Module):
    """OpenRLHF's PolicyLoss plus the SAPO term; same call signature and return tuple."""

    def __init__(self, base: nn.Module, config: SAPOConfig) -> None:
        super().__init__()
        self.base = base
        self.config = config
        self.last_stats: dict[str, torch.Tensor] = {}

    def __getattr__(self, name: str) -> Any:
        # Expose the wrapped loss's settings (clip_eps_low, token_level_loss, ...) unchanged.
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["base"], name)

    def forward(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                action_mask: torch.Tensor | None = None, rollout_log_probs: torch.Tensor | None = None,
                dp_size: int = 1, batch_num_tokens=None, global_batch_size=None):
        from openrlhf.models import aggregate_loss

        loss, *rest = self.base(log_probs, old_log_probs, advantages, action_mask=action_mask,
                                rollout_log_probs=rollout_log_probs, dp_size=dp_size,
                                batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
        mask = action_mask if action_mask is not None else torch.ones_like(log_probs)
        term, stats = sapo_loss(log_probs, old_log_probs, advantages, mask, self.config, aggregate=lambda t, m: (
            aggregate_loss(t, m, token_level_loss=self.base.token_level_loss, dp_size=dp_size,
                           batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)))
        self.last_stats = stats.as_dict()
        return (loss + term, *rest)


def _wrap_init(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        config = sapo_config_from_args(self.args)
        if config is not None and not isinstance(self.actor_loss_fn, SAPOPolicyLoss):
            self.actor_loss_fn = SAPOPolicyLoss(self.actor_loss_fn, config)
    return __init__


def _wrap_training_step(step):
    @functools.wraps(step)
    def training_step(self, *args, **kwargs):
        loss_fn = self.actor_loss_fn
        if isinstance(loss_fn, SAPOPolicyLoss):
            loss_fn.last_stats = {}
        status = step(self, *args, **kwargs)
        if isinstance(loss_fn, SAPOPolicyLoss):
            for name, value in loss_fn.last_stats.items():
                status["metrics"][name] = value
                status["weights"][name] = "token"
        return status
    return training_step


def install_sapo_patch() -> None:
    """Wrap ``ActorPPOTrainer.__init__`` and ``training_step`` in this process (idempotent)."""
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    if getattr(ActorPPOTrainer, _PATCH_MARK, False):
        return
    ActorPPOTrainer.__init__ = _wrap_init(ActorPPOTrainer.__init__)
    ActorPPOTrainer.training_step = _wrap_training_step(ActorPPOTrainer.training_step)
    setattr(ActorPPOTrainer, _PATCH_MARK, True)


def sapo_patch_active() -> bool:
    """True when this process builds ``ActorPPOTrainer`` with the SAPO wrapper (checked in Ray workers)."""
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    return bool(getattr(ActorPPOTrainer, _PATCH_MARK, False))
