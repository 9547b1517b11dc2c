"""The mechanism on the log: where each estimator puts its advantage mass, per tool-call stratum.

Stratified GRPO's claim (bench/strata_sim.py, docs/mechanism.md) is that SAN removes the
*cross-stratum* signal: inside a stratum its advantages sum to zero, so the SAN part pushes no
stratum as a whole up or down; only the GN part (weight 1 - alpha) tells the policy which
stratum (how many tool calls) pays. This module measures that on every batch, for every
estimator (GRPO included), always on the *tool-call* strata (the structural key), whatever
strata the estimator itself used: for the random-strata control the SAN part then shows mass
that leaks across tool-call strata, which is the control's mechanism.

Per tool-call count k (k >= :data:`MAX_STRATUM` merged into ``stratum{MAX_STRATUM}plus``, so
the key set stays bounded), with N the number of samples in the batch:

    share         = |S_k| / N
    reward        = mean of R over S_k                          (NaN when S_k is empty)
    adv_mass_san  = sum_{i in S_k} alpha * A_stratum_i / N
    adv_mass_gn   = sum_{i in S_k} (1 - alpha) * A_group_i / N
    adv_mass      = adv_mass_san + adv_mass_gn

Dividing by N (not |S_k|) makes the numbers comparable across batch sizes and additive: the
masses of all strata sum to the batch's total advantage mass (0 for GN and SAN). For Stratified
GRPO A_stratum = A_SAN and A_group = A_GN; for stratified_reinforce/rloo they are the two
baselined terms of the blend (alpha=1 and alpha=0 of the estimator). The advantage is the
estimator's sequence-level scalar, before token broadcasting, the KL term, batch whitening
(stratified_reinforce on the cluster) and CalibAdv: those act per token afterwards, and the
identities below hold for the scalar. Two identities make the metric a check:

- with the estimator's strata = the tool-call strata, adv_mass_san = 0 in every stratum;
- hence Stratified GRPO's adv_mass per stratum = (1 - alpha) * GRPO's on the same samples.

Pure torch, vectorized (one bincount / index_add per quantity, no loop over strata).
"""

from __future__ import annotations

import torch

from openrlhf_sgrpo.advantages import compute_stratified

MAX_STRATUM = 4  # tool-call counts >= this share the last stratum ("stratum4plus")
PREFIX = "sgrpo/"
FIELDS: tuple[str, ...] = ("share", "reward", "adv_mass", "adv_mass_san", "adv_mass_gn")


def stratum_name(k: int) -> str:
    """'stratum0' .. 'stratum3', 'stratum4plus' (the merged tail)."""
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"a tool-call stratum is a count >= 0, got {k!r}")
    return f"stratum{MAX_STRATUM}plus" if k >= MAX_STRATUM else f"stratum{k}"


STRATUM_NAMES: tuple[str, ...] = tuple(stratum_name(k) for k in range(MAX_STRATUM + 1))
METRIC_KEYS: tuple[str, ...] = tuple(f"{PREFIX}{name}/{field}" for name in STRATUM_NAMES for field in FIELDS)


def mechanism_metrics(rewards: torch.Tensor, tool_calls: torch.Tensor, group_term: torch.Tensor,
                      stratum_term: torch.Tensor | None = None, alpha: float = 0.0) -> dict[str, float]:
    """Per tool-call stratum: share, mean reward, advantage mass with the SAN and GN parts apart.

    ``group_term`` is the estimator's group-baselined advantage (A_GN for (Stratified) GRPO),
    ``stratum_term`` its stratum-baselined one on the estimator's *own* strata (A_SAN; None with
    alpha = 0, e.g. GRPO), ``alpha`` the blend weight, ``tool_calls`` the samples' integer
    tool-call counts. Every key of :data:`METRIC_KEYS` is returned (an empty stratum has share
    and mass 0 and reward NaN), so each step logs the same bounded set.
    """
    n = rewards.numel()
    if rewards.dim() != 1 or n == 0:
        raise ValueError(f"rewards must be a non-empty flat tensor, got shape {tuple(rewards.shape)}")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    for name, t in (("tool_calls", tool_calls), ("group_term", group_term), ("stratum_term", stratum_term)):
        if t is not None and t.shape != rewards.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != rewards shape {tuple(rewards.shape)}")
    if stratum_term is None and alpha != 0:
        raise ValueError(f"alpha={alpha!r} blends a stratum term: pass stratum_term (A_SAN)")
    calls = torch.as_tensor(tool_calls)
    if calls.is_floating_point():
        if not bool((calls == calls.round()).all()):
            raise ValueError(f"tool_calls must be integer counts, got {calls.tolist()[:8]}")
        calls = calls.round()
    calls = calls.to(torch.int64)
    if bool((calls < 0).any()):
        raise ValueError(f"tool_calls must be counts >= 0, got min {int(calls.min())}")

    dt = torch.float64
    seg = calls.clamp_max(MAX_STRATUM).cpu()
    width = MAX_STRATUM + 1

    def per_stratum(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(width, dtype=dt).index_add_(0, seg, values.detach().to(dt).reshape(-1).cpu())

    count = torch.bincount(seg, minlength=width).to(dt)
    reward_sum = per_stratum(rewards)
    mass_gn = per_stratum(group_term) * (1.0 - float(alpha)) / n
    mass_san = (per_stratum(stratum_term) * float(alpha) / n if stratum_term is not None and alpha != 0
                else torch.zeros(width, dtype=dt))
    mean_reward = torch.where(count > 0, reward_sum / count.clamp_min(1), torch.full_like(count, float("nan")))
    out: dict[str, float] = {}
    for k, name in enumerate(STRATUM_NAMES):
        base = f"{PREFIX}{name}/"
        out[base + "share"] = float(count[k] / n)
        out[base + "reward"] = float(mean_reward[k])
        out[base + "adv_mass"] = float(mass_san[k] + mass_gn[k])
        out[base + "adv_mass_san"] = float(mass_san[k])
        out[base + "adv_mass_gn"] = float(mass_gn[k])
    return out


def estimator_mechanism(estimator: str, rewards: torch.Tensor, strata: torch.Tensor, tool_calls: torch.Tensor,
                        n_samples_per_prompt: int, alpha: float, eps: float = 1e-6,
                        std: str = "population") -> dict[str, float]:
    """:func:`mechanism_metrics` for one of our estimators on its own ``strata``.

    ``grpo`` is Stratified GRPO at alpha 0. The two terms are the estimator at alpha 1 (stratum
    term) and alpha 0 (group term), so ``alpha * stratum + (1 - alpha) * group`` is exactly the
    advantage it trains with (stratified_rloo's stratum term falls back to the group's
    leave-one-out baseline in a singleton stratum, so its SAN mass need not vanish).
    """
    if estimator == "grpo":
        estimator, alpha = "stratified_grpo", 0.0
    group = compute_stratified(estimator, rewards, strata, n_samples_per_prompt, 0.0, eps, std)
    stratum = (compute_stratified(estimator, rewards, strata, n_samples_per_prompt, 1.0, eps, std)
               if alpha != 0 else None)
    return mechanism_metrics(rewards, tool_calls, group, stratum, alpha)
