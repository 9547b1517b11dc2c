"""Stratified advantage estimators (pure torch, vectorized).

Search-agent trajectories of one prompt differ in *structure* (how many tool calls they make),
so a single group baseline compares trajectories of different kinds. Stratified GRPO
(Algorithm 1 of the paper) splits each prompt's samples into strata by a structural key and
normalizes inside each stratum (SAN), then blends with global group normalization (GN):

    A_GN  = (R - mean_prompt) / (std_prompt + eps)
    A_SAN = (R - mean_{prompt,stratum}) / (std_{prompt,stratum} + eps)
    A     = alpha * A_SAN + (1 - alpha) * A_GN

Inputs are flat ``[num_prompts * n]`` tensors in prompt-contiguous order (the order OpenRLHF
restores with ``experience.index``). Every statistic is a segment reduction (``index_add_``)
over (prompt, stratum) ids: no Python loop over prompts or strata.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

StdKind = Literal["population", "unbiased"]
STD_KINDS: tuple[str, ...] = ("population", "unbiased")

# Strata ids below this bound index a dense (prompt, stratum) grid directly; larger or negative
# ids are compacted with torch.unique first (one sort), which is slower but fully general.
_DENSE_STRATA_LIMIT = 64


@dataclass(frozen=True)
class Segments:
    """Segment ids for the prompt groups and the (prompt, stratum) cells of one batch."""

    group: torch.Tensor  # [N] prompt index of every sample
    cell: torch.Tensor  # [N] (prompt, stratum) cell index of every sample
    num_groups: int
    num_cells: int  # includes empty cells when the dense grid is used


def validate_inputs(rewards: torch.Tensor, strata: torch.Tensor | None, n_samples_per_prompt: int,
                    alpha: float | None = None) -> None:
    """Raise ValueError naming the bad value; estimators call this before any math."""
    if not isinstance(n_samples_per_prompt, int) or n_samples_per_prompt < 2:
        raise ValueError(
            f"n_samples_per_prompt must be an int >= 2 for a group baseline, got {n_samples_per_prompt!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a flat [num_prompts * n] tensor, got shape {tuple(rewards.shape)}")
    if rewards.numel() == 0 or rewards.numel() % n_samples_per_prompt:
        raise ValueError(
            f"rewards length {rewards.numel()} is not a positive multiple of "
            f"n_samples_per_prompt={n_samples_per_prompt}")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be floating point, got dtype {rewards.dtype}")
    bad = ~torch.isfinite(rewards)
    if bool(bad.any()):
        idx = int(bad.nonzero()[0])
        raise ValueError(f"rewards must be finite: rewards[{idx}] = {rewards[idx].item()}")
    if strata is not None:
        if strata.shape != rewards.shape:
            raise ValueError(f"strata shape {tuple(strata.shape)} != rewards shape {tuple(rewards.shape)}")
        if strata.is_floating_point() or strata.dtype == torch.bool:
            raise ValueError(f"strata must be an integer tensor (int64), got dtype {strata.dtype}")
    if alpha is not None and not (0.0 <= float(alpha) <= 1.0 and math.isfinite(float(alpha))):
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")


def make_segments(strata: torch.Tensor, n_samples_per_prompt: int) -> Segments:
    """Map every sample to its prompt group and its (prompt, stratum) cell."""
    num = strata.numel()
    num_groups = num // n_samples_per_prompt
    group = torch.arange(num_groups, device=strata.device).repeat_interleave(n_samples_per_prompt)
    lo, hi = (int(v) for v in torch.aminmax(strata))
    if lo >= 0 and hi < _DENSE_STRATA_LIMIT:
        width = hi + 1
        return Segments(group, group * width + strata, num_groups, num_groups * width)
    _, compact = torch.unique(strata, return_inverse=True)
    width = int(compact.max()) + 1
    _, cell = torch.unique(group * width + compact, return_inverse=True)
    return Segments(group, cell, num_groups, int(cell.max()) + 1)


def first_of_segment(values: torch.Tensor, seg: torch.Tensor, num: int) -> torch.Tensor:
    """Each segment's first value (by position), per segment (an empty segment gets any value)."""
    position = torch.arange(values.numel(), device=values.device)
    first = torch.full((num,), values.numel(), dtype=position.dtype, device=values.device)
    first = first.scatter_reduce_(0, seg, position, reduce="amin").clamp_max_(max(values.numel() - 1, 0))
    return values[first] if values.numel() else torch.zeros(num, dtype=values.dtype, device=values.device)


def segment_moments(values: torch.Tensor, seg: torch.Tensor, num: int) -> tuple[torch.Tensor, ...]:
    """Per-segment count, mean and sum of squared deviations (two-pass, no cancellation).

    The sums run over the values shifted by their segment's first value: deviations are
    shift-invariant, and a constant segment becomes exact zeros. Unshifted, the float mean of a
    constant segment (3 * 1.68 / 3) can miss its value by an ulp, leaving a 1e-16 std that turns
    a zero advantage into -1 when eps=0.
    """
    pivot = first_of_segment(values, seg, num)
    shifted = values - pivot[seg]
    count = torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(0, seg, torch.ones_like(values))
    total = torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(0, seg, shifted)
    shifted_mean = total / count.clamp_min(1)
    dev = shifted - shifted_mean[seg]
    sq = torch.zeros(num, dtype=values.dtype, device=values.device).index_add_(0, seg, dev * dev)
    return count, pivot + shifted_mean, sq, dev


def _std(count: torch.Tensor, sq: torch.Tensor, std: str) -> torch.Tensor:
    if std == "population":
        return (sq / count.clamp_min(1)).sqrt()
    if std == "unbiased":
        # Bessel's correction is undefined for a single sample; its deviation is 0 anyway.
        return torch.where(count > 1, sq / (count - 1).clamp_min(1), torch.zeros_like(sq)).sqrt()
    raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")


def _work_dtype(rewards: torch.Tensor) -> torch.dtype:
    return torch.promote_types(rewards.dtype, torch.float32)


def normalized_advantages(rewards: torch.Tensor, seg: torch.Tensor, num: int, eps: float,
                          std: str = "population") -> torch.Tensor:
    """(R - mean_seg) / (std_seg + eps) for any segmentation; degenerate segments give 0."""
    count, _, sq, dev = segment_moments(rewards, seg, num)
    return _safe_divide(dev, _std(count, sq, std)[seg] + eps)


def _safe_divide(dev: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    # With eps=0 a constant segment is 0/0: its deviation is exactly 0, and so is 0/tiny.
    return dev / denom.clamp_min(torch.finfo(dev.dtype).tiny)


def group_normalized_advantages(rewards: torch.Tensor, n_samples_per_prompt: int, eps: float,
                                std: str = "population") -> torch.Tensor:
    """GRPO's A_GN; prompt groups are contiguous, so a reshape replaces the segment reduction."""
    x = rewards.view(-1, n_samples_per_prompt)
    x = x - x[:, :1]  # shift by the group's first reward: a constant group is exact zeros (see segment_moments)
    dev = x - x.mean(-1, keepdim=True)
    sq = (dev * dev).sum(-1, keepdim=True)
    count = torch.full_like(sq, n_samples_per_prompt)
    return _safe_divide(dev, _std(count, sq, std) + eps).reshape(-1)


def stratified_advantages(rewards: torch.Tensor, strata: torch.Tensor, n_samples_per_prompt: int,
                          alpha: float = 0.6, eps: float = 1e-6, std: StdKind = "population") -> torch.Tensor:
    """Stratified GRPO advantages (Algorithm 1): alpha * A_SAN + (1 - alpha) * A_GN.

    alpha=0 is GRPO's group normalization, alpha=1 is SAN alone. Singleton and constant strata
    get A_SAN = 0 (their deviation from their own mean is 0).
    """
    validate_inputs(rewards, strata, n_samples_per_prompt, alpha)
    if eps < 0 or not math.isfinite(eps):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    r = rewards.to(_work_dtype(rewards))
    a_gn = group_normalized_advantages(r, n_samples_per_prompt, eps, std)
    if alpha == 0:
        return a_gn
    segs = make_segments(strata, n_samples_per_prompt)
    a_san = normalized_advantages(r, segs.cell, segs.num_cells, eps, std)
    return alpha * a_san + (1 - alpha) * a_gn


def stratified_baseline_advantages(rewards: torch.Tensor, strata: torch.Tensor, n_samples_per_prompt: int,
                                   alpha: float = 0.6) -> torch.Tensor:
    """REINFORCE with a stratified mean baseline, blended with the prompt mean, no std scaling."""
    validate_inputs(rewards, strata, n_samples_per_prompt, alpha)
    r = rewards.to(_work_dtype(rewards))
    segs = make_segments(strata, n_samples_per_prompt)
    dev_group = segment_moments(r, segs.group, segs.num_groups)[3]
    dev_cell = segment_moments(r, segs.cell, segs.num_cells)[3]
    return alpha * dev_cell + (1 - alpha) * dev_group


def _leave_one_out(r: torch.Tensor, seg: torch.Tensor, num: int) -> tuple[torch.Tensor, torch.Tensor]:
    """R - mean of the *other* members of the segment, and each sample's segment size."""
    r = r - first_of_segment(r, seg, num)[seg]  # exact zeros for a constant segment (see segment_moments)
    count = torch.zeros(num, dtype=r.dtype, device=r.device).index_add_(0, seg, torch.ones_like(r))[seg]
    total = torch.zeros(num, dtype=r.dtype, device=r.device).index_add_(0, seg, r)[seg]
    return r - (total - r) / (count - 1).clamp_min(1), count


def stratified_rloo_advantages(rewards: torch.Tensor, strata: torch.Tensor, n_samples_per_prompt: int,
                               alpha: float = 0.6) -> torch.Tensor:
    """RLOO with the leave-one-out baseline taken inside the stratum, blended with prompt RLOO.

    A singleton stratum has no other member, so its stratified term falls back to the
    prompt-group leave-one-out baseline.
    """
    validate_inputs(rewards, strata, n_samples_per_prompt, alpha)
    r = rewards.to(_work_dtype(rewards))
    segs = make_segments(strata, n_samples_per_prompt)
    loo_group, _ = _leave_one_out(r, segs.group, segs.num_groups)
    loo_cell, cell_size = _leave_one_out(r, segs.cell, segs.num_cells)
    loo_cell = torch.where(cell_size > 1, loo_cell, loo_group)
    return alpha * loo_cell + (1 - alpha) * loo_group


STRATIFIED_ESTIMATORS: tuple[str, ...] = ("stratified_grpo", "stratified_reinforce", "stratified_rloo")


def compute_stratified(estimator: str, rewards: torch.Tensor, strata: torch.Tensor, n_samples_per_prompt: int,
                       alpha: float, eps: float = 1e-6, std: StdKind = "population") -> torch.Tensor:
    """Dispatch by the CLI's estimator name (one place that knows the names)."""
    if estimator == "stratified_grpo":
        return stratified_advantages(rewards, strata, n_samples_per_prompt, alpha=alpha, eps=eps, std=std)
    if estimator == "stratified_reinforce":
        return stratified_baseline_advantages(rewards, strata, n_samples_per_prompt, alpha=alpha)
    if estimator == "stratified_rloo":
        return stratified_rloo_advantages(rewards, strata, n_samples_per_prompt, alpha=alpha)
    raise ValueError(f"unknown stratified estimator {estimator!r}; choose one of {STRATIFIED_ESTIMATORS}")
