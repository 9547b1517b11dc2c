"""SAPO: a conditional KL term that keeps positive tokens from drifting away (pure torch).

"Improving Search Agent with One Line of Code" (Li et al., 2026, arXiv 2603.10069) traces GRPO
collapses in search agents to *importance-sampling distribution drift*: the current policy
pushes the probability of tokens from good rollouts far below the old policy's, their ratio
r = pi_theta / pi_old collapses toward 0 and the clipped surrogate stops sending them gradient.
SAPO adds, only on those tokens (advantage >= 0 and r <= t), a penalty

    coef * KL(pi_old || pi_theta)     estimated per token from samples of pi_old:
        k1 = -log r                   (unbiased, can be negative)
        k3 = (r - 1) - log r          (unbiased, >= 0, zero gradient at r = 1)

aggregated over the action tokens exactly like the policy loss (token mean by default), and
added to it. The paper's text available to us gives the rule in words (abstract + summaries),
not its code: the per-token mask and the estimators above are this project's reading of it.

This module is the one definition; the OpenRLHF actor patch and the single-machine runner
both call :func:`sapo_loss` with their policy loss's reducer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

SAPO_ESTIMATORS: tuple[str, ...] = ("k1", "k3")
DEFAULT_COEF = 1.0
DEFAULT_RATIO_THRESHOLD = 0.5
DEFAULT_ESTIMATOR = "k3"
# log-ratio clamp, the same band OpenRLHF's PolicyLoss uses, so exp() never overflows.
_LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class SAPOConfig:
    """The three knobs of the term; ``coef=0`` makes it a no-op (stats are still computed)."""

    coef: float = DEFAULT_COEF
    ratio_threshold: float = DEFAULT_RATIO_THRESHOLD
    estimator: str = DEFAULT_ESTIMATOR

    def __post_init__(self) -> None:
        for message in config_errors(self.coef, self.ratio_threshold, self.estimator):
            raise ValueError(message)


def config_errors(coef: float, ratio_threshold: float, estimator: str, prefix: str = "") -> list[str]:
    """Every problem with a SAPO setting, each naming the option (``prefix`` = CLI flag stem)."""
    errors = []
    if not (isinstance(coef, (int, float)) and math.isfinite(coef) and coef >= 0):
        errors.append(f"{prefix}coef must be a finite number >= 0, got {coef!r}")
    if not (isinstance(ratio_threshold, (int, float)) and math.isfinite(ratio_threshold) and ratio_threshold > 0):
        errors.append(f"{prefix}ratio_threshold must be a finite number > 0, got {ratio_threshold!r}")
    if estimator not in SAPO_ESTIMATORS:
        errors.append(f"{prefix}estimator must be one of {SAPO_ESTIMATORS}, got {estimator!r}")
    return errors


@dataclass(frozen=True)
class SAPOStats:
    """What a training log needs to see whether the term is doing anything."""

    penalized_share: torch.Tensor  # 0-dim: penalized tokens / action tokens
    mean_ratio: torch.Tensor  # 0-dim: mean IS ratio pi_theta / pi_old over action tokens
    term: torch.Tensor  # 0-dim: the aggregated, coef-weighted term (detached)

    def as_dict(self, prefix: str = "sapo/") -> dict[str, torch.Tensor]:
        return {f"{prefix}penalized_share": self.penalized_share, f"{prefix}mean_ratio": self.mean_ratio,
                f"{prefix}term": self.term}


def kl_old_to_new(log_probs: torch.Tensor, old_log_probs: torch.Tensor, estimator: str = DEFAULT_ESTIMATOR
                  ) -> torch.Tensor:
    """Per-token estimate of KL(pi_old || pi_theta) from tokens sampled by pi_old."""
    log_ratio = (log_probs - old_log_probs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"SAPO estimator must be one of {SAPO_ESTIMATORS}, got {estimator!r}")


def penalized_mask(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                   action_mask: torch.Tensor | None, ratio_threshold: float) -> torch.Tensor:
    """Action tokens with advantage >= 0 whose ratio pi_theta/pi_old fell to <= threshold."""
    ratio = (log_probs.detach() - old_log_probs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
    mask = (advantages >= 0) & (ratio <= ratio_threshold)
    if action_mask is not None:
        mask = mask & action_mask.bool()
    return mask


def sapo_token_penalty(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                       action_mask: torch.Tensor | None, config: SAPOConfig
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``coef * KL`` on penalized tokens (0 elsewhere) and the penalized-token mask.

    Aggregate the first output with the same reducer as the policy loss (OpenRLHF's
    ``aggregate_loss`` with the action mask) so both terms share one normalization.
    """
    _check_shapes(log_probs, old_log_probs, advantages, action_mask)
    mask = penalized_mask(log_probs, old_log_probs, advantages, action_mask, config.ratio_threshold)
    kl = kl_old_to_new(log_probs, old_log_probs, config.estimator)
    return config.coef * kl * mask.to(kl.dtype), mask


def sapo_stats(log_probs: torch.Tensor, old_log_probs: torch.Tensor, action_mask: torch.Tensor | None,
               mask: torch.Tensor, term: torch.Tensor) -> SAPOStats:
    """Share of penalized tokens, mean IS ratio, and the term, all over action tokens."""
    valid = torch.ones_like(mask) if action_mask is None else action_mask.bool()
    n = valid.sum().clamp_min(1).to(torch.float32)
    ratio = (log_probs.detach() - old_log_probs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
    return SAPOStats(
        penalized_share=(mask & valid).sum().to(torch.float32) / n,
        mean_ratio=(ratio.to(torch.float32) * valid).sum() / n,
        term=term.detach().to(torch.float32),
    )


def sapo_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
              action_mask: torch.Tensor | None, config: SAPOConfig, num_tokens: float | torch.Tensor | None = None,
              aggregate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
              ) -> tuple[torch.Tensor, SAPOStats]:
    """The SAPO term (to add to the policy loss) and its stats: the one entry point of every caller.

    ``aggregate(per_token, mask)`` is the policy loss's own reducer (OpenRLHF's ``aggregate_loss``
    with its batch normalization), so both terms share one normalization. Without it the term is a
    token mean over ``num_tokens`` (default: the batch's action tokens).
    """
    per_token, mask = sapo_token_penalty(log_probs, old_log_probs, advantages, action_mask, config)
    if aggregate is not None:
        term = aggregate(per_token, torch.ones_like(per_token) if action_mask is None else action_mask)
    else:
        if num_tokens is None:
            num_tokens = per_token.numel() if action_mask is None else action_mask.sum()
        denom = torch.as_tensor(num_tokens, dtype=per_token.dtype, device=per_token.device).clamp_min(1)
        term = per_token.sum() / denom
    return term, sapo_stats(log_probs, old_log_probs, action_mask, mask, term)


def _check_shapes(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                  action_mask: torch.Tensor | None) -> None:
    shape = tuple(log_probs.shape)
    for name, t in (("old_log_probs", old_log_probs), ("advantages", advantages), ("action_mask", action_mask)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"SAPO: {name} shape {tuple(t.shape)} != log_probs shape {shape}")
