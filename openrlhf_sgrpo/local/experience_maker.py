"""A rollout batch → everything the update needs, computed once per step (OpenRLHF's experience maker).

The same functions as the OpenRLHF path: strata from the agent's info keys, or the random-strata
control drawn from the step's generator (:func:`openrlhf_sgrpo.strata.batch_strata`), the
estimator dispatch (:func:`openrlhf_sgrpo.advantages.compute_stratified`), the paper monitors
(:func:`openrlhf_sgrpo.metrics.stratification_metrics`) and the advantage mass per tool-call
stratum (:func:`openrlhf_sgrpo.mechanism.estimator_mechanism`), upstream ``compute_reward`` for the
token path, and optionally CalibAdv on the token advantages of the *whole* batch (it needs
complete prompt groups; ``turn_info.turn_tensors`` reads the agent's turn slots). Like
``RemoteExperienceMaker.make_experience``, the policy's log-probs (``old_log_probs``) and the
reference's are computed here, once, before any optimizer step, so PPO clipping and SAPO see
the ratio to the policy that sampled. The local rollout keeps samples prompt-contiguous, so no
``experience.index`` reordering is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from agent_env import info_keys as K
from openrlhf_sgrpo.advantages import (
    STRATIFIED_ESTIMATORS,
    compute_stratified,
    group_normalized_advantages,
    make_segments,
    normalized_advantages,
)
from openrlhf_sgrpo.calibadv import CalibAdvConfig, calibadv_token_advantages
from openrlhf_sgrpo.local import upstream
from openrlhf_sgrpo.local.experience import Sample, collate, info_tensor
from openrlhf_sgrpo.local.loss import action_log_probs
from openrlhf_sgrpo.mechanism import estimator_mechanism
from openrlhf_sgrpo.metrics import stratification_metrics
from openrlhf_sgrpo.openrlhf_ext.turn_info import turn_tensors
from openrlhf_sgrpo.strata import DEFAULT_STRATIFY_BY, batch_strata, parse_strata_spec

# "grpo" is group normalization alone: Stratified GRPO with alpha = 0 (same math, same code).
ESTIMATORS: tuple[str, ...] = ("grpo", *STRATIFIED_ESTIMATORS)


@dataclass(frozen=True)
class AdvantageConfig:
    estimator: str = "stratified_grpo"
    alpha: float = 0.6
    eps: float = 1e-6
    std: str = "population"
    stratify_by: str = DEFAULT_STRATIFY_BY
    strata_cap: int | None = None
    calibadv: CalibAdvConfig | None = None

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        parse_strata_spec(self.stratify_by)  # a bad spec fails here, naming itself, not at step 1


@dataclass
class AdvantageResult:
    advantages: torch.Tensor  # [N] per-sample scalar advantage (the blend), prompt order
    rewards: torch.Tensor  # [N]
    strata: torch.Tensor  # [N] int64
    san: torch.Tensor | None = None  # [N] A_SAN (stratified_grpo / grpo only)
    gn: torch.Tensor | None = None  # [N] A_GN (stratified_grpo / grpo only)
    metrics: dict[str, float] = field(default_factory=dict)


def sample_advantages(samples: list[Sample], n_samples_per_prompt: int, cfg: AdvantageConfig,
                      generator: torch.Generator | None = None) -> AdvantageResult:
    """Per-sample advantages for prompt-contiguous samples (``n_samples_per_prompt`` per prompt).

    ``generator`` draws random strata (``stratify_by`` random:KEYS or random_k:K; the trainer
    seeds it from the run seed and step); structural strata ignore it. ``metrics`` holds the
    paper monitors on the estimator's strata and the mechanism (:mod:`openrlhf_sgrpo.mechanism`)
    on the tool-call strata."""
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    keys = parse_strata_spec(cfg.stratify_by).keys
    info = {k: info_tensor(samples, k) for k in keys}
    strata = batch_strata(info, cfg.stratify_by, len(samples), n_samples_per_prompt, cfg.strata_cap, generator)
    estimator, alpha = (("stratified_grpo", 0.0) if cfg.estimator == "grpo" else (cfg.estimator, cfg.alpha))
    adv = compute_stratified(estimator, rewards, strata, n_samples_per_prompt, alpha, cfg.eps, cfg.std)
    san = gn = None
    if estimator == "stratified_grpo":  # the two parts of the blend, for per-sample records
        gn = group_normalized_advantages(rewards, n_samples_per_prompt, cfg.eps, cfg.std)
        segs = make_segments(strata, n_samples_per_prompt)
        san = normalized_advantages(rewards, segs.cell, segs.num_cells, cfg.eps, cfg.std)
    metrics = stratification_metrics(rewards, strata, n_samples_per_prompt, adv, eps=cfg.eps)
    metrics.update(estimator_mechanism(cfg.estimator, rewards, strata, info_tensor(samples, K.TOOL_CALLS),
                                       n_samples_per_prompt, cfg.alpha, cfg.eps, cfg.std))
    return AdvantageResult(adv.to(torch.float32), rewards, strata, san, gn, metrics)


def cumulative_returns(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """OpenRLHF's ``get_cumulative_returns``: discounted reverse sum of the masked token rewards."""
    masked = rewards * action_mask
    if gamma == 1.0:
        return masked.flip(-1).cumsum(-1).flip(-1)
    returns = torch.zeros_like(masked)
    running = torch.zeros(masked.shape[0], dtype=masked.dtype, device=masked.device)
    for t in reversed(range(masked.shape[1])):
        running = masked[:, t] + gamma * running
        returns[:, t] = running
    return returns


def token_advantages(advantages: torch.Tensor, action_mask: torch.Tensor, kl: torch.Tensor | None = None,
                     kl_coef: float = 0.0) -> torch.Tensor:
    """The REINFORCE-family token path: upstream ``compute_reward`` (advantage on the last action
    token, minus ``kl_coef * kl`` per token), then cumulative returns (gamma = 1)."""
    mask = action_mask.to(torch.float32)
    kl_t = kl if kl is not None else torch.zeros_like(mask)
    reward = upstream.compute_reward(advantages, kl_coef, kl_t, action_mask=action_mask)
    return cumulative_returns(reward, mask)


def apply_calibadv(token_adv: torch.Tensor, action_mask: torch.Tensor, samples: list[Sample],
                   rollout_adv: torch.Tensor, group_size: int, cfg: CalibAdvConfig) -> tuple[torch.Tensor, dict]:
    """CalibAdv on the token advantages of whole prompt groups, reading the agent's info like the
    OpenRLHF hook (``turn_info.turn_tensors``: turn slots, think similarities, F1, the format
    verdict). ``samples`` must hold complete groups (``group_size`` each)."""
    keys = samples[0].info.keys()
    info = {k: info_tensor(samples, k) for k in keys}
    turns = turn_tensors(info)
    return calibadv_token_advantages(token_adv, group_size=group_size, action_mask=action_mask.bool(),
                                     rollout_advantage=rollout_adv, config=cfg, **turns)


@dataclass
class Experience:
    """One step's rollout, ready for any number of optimizer steps; per-sample lists in prompt order.

    Token-level tensors are per sample (length ``len(sequences) - 1``, unpadded) so mini-batches
    can be re-collated in any order.
    """

    samples: list[Sample]
    advantage: AdvantageResult
    returns: list[torch.Tensor]  # token advantages from the estimator's scalar (before CalibAdv)
    token_advantages: list[torch.Tensor]  # what the loss uses (after CalibAdv when enabled)
    # the sampling policy's log-probs, computed once; None when the update scores the rollout with
    # the weights that sampled it (one optimizer step per rollout: see make_experience)
    old_log_probs: list[torch.Tensor] | None
    ref_log_probs: list[torch.Tensor] | None
    calibadv_stats: dict[str, float] = field(default_factory=dict)


def _rows(padded: torch.Tensor, samples: list[Sample]) -> list[torch.Tensor]:
    return [padded[i, : s.action_mask.numel()].clone() for i, s in enumerate(samples)]


@torch.no_grad()
def policy_log_probs(model, samples: list[Sample], pad_id: int, micro_batch_size: int) -> list[torch.Tensor]:
    """Per-sample log-probs under ``model`` (eval mode, no grad), in micro-batches; CPU tensors."""
    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = []
    try:
        for lo in range(0, len(samples), micro_batch_size):
            part = samples[lo: lo + micro_batch_size]
            logp = action_log_probs(model, collate(part, pad_id)).float().cpu()
            out.extend(_rows(logp, part))
    finally:
        model.train(was_training)
    return out


def make_experience(samples: list[Sample], n_samples_per_prompt: int, cfg: AdvantageConfig, model, pad_id: int,
                    micro_batch_size: int, ref_model=None, old_from_update: bool = False,
                    generator: torch.Generator | None = None) -> Experience:
    """Advantages, token advantages (+ CalibAdv over whole groups), old and reference log-probs.

    ``old_from_update``: the caller updates with one optimizer step that sees every sample once,
    so the weights that score each micro-batch in the update are still the weights that sampled
    it (gradients only accumulate until that step). The old log-probs then equal the update's own
    (detached) log-probs, and the no-grad forward pass that would compute them here, a fifth of
    the update's compute with gradient checkpointing, is skipped: the loss, its gradient and the
    ratio (exactly 1) are what that pass would give, up to float noise between two forwards.
    ``generator`` draws random strata (see :func:`sample_advantages`)."""
    adv = sample_advantages(samples, n_samples_per_prompt, cfg, generator)
    mask = collate(samples, pad_id).action_mask
    returns = token_advantages(adv.advantages, mask)
    final, calib_stats = returns, {}
    if cfg.calibadv is not None:
        final, calib_stats = apply_calibadv(returns, mask, samples, adv.advantages, n_samples_per_prompt,
                                            cfg.calibadv)
    old = None if old_from_update else policy_log_probs(model, samples, pad_id, micro_batch_size)
    ref = policy_log_probs(ref_model, samples, pad_id, micro_batch_size) if ref_model is not None else None
    return Experience(samples, adv, _rows(returns, samples), _rows(final, samples), old, ref,
                      {k: float(v) for k, v in calib_stats.items()})
