"""Paper metrics and theorem monitors, computed per batch and logged every step.

With prompt groups of K samples and strata k of size n_k:
- Theorem 1: Var[A_G] - Var[A_S] = (1/K) sum_k n_k (Rbar_k - Rbar)^2, where A_G = R - Rbar
  (global baseline) and A_S = R - Rbar_k (stratified baseline). The left side is measured, the
  right side computed independently, so the pair is a live check of the implementation.
- Theorem 4: inside a non-constant stratum, SAN advantages have variance 1 (eps -> 0).
- Theorem 5: the group variance of SAN advantages is the share of samples in non-constant
  strata (<= 1), whereas GN's is 1.
All numbers are averages over prompts (or over strata), returned as plain floats.
"""

from __future__ import annotations

import torch

from openrlhf_sgrpo.advantages import make_segments, normalized_advantages, segment_moments, validate_inputs

# Strata whose reward spread is below this are "constant": SAN gives them 0, so Theorem 4's
# unit variance does not apply to them.
_CONSTANT_TOL = 1e-12


def _mean_over(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values[mask].mean()) if bool(mask.any()) else float("nan")


def stratification_metrics(rewards: torch.Tensor, strata: torch.Tensor, n_samples_per_prompt: int,
                           advantages: torch.Tensor | None = None, eps: float = 1e-6) -> dict[str, float]:
    """Variance decomposition, theorem monitors and strata shape statistics for one batch."""
    validate_inputs(rewards, strata, n_samples_per_prompt)
    r = rewards.to(torch.float64)
    segs = make_segments(strata, n_samples_per_prompt)
    g_count, g_mean, g_sq, _ = segment_moments(r, segs.group, segs.num_groups)
    c_count, c_mean, c_sq, _ = segment_moments(r, segs.cell, segs.num_cells)
    k = float(n_samples_per_prompt)

    var_global = g_sq / k  # Var[A_G] per prompt
    cell_group = _cell_group(segs)
    var_strat = torch.zeros_like(g_sq).index_add_(0, cell_group, c_sq) / k  # Var[A_S]
    between = torch.zeros_like(g_sq).index_add_(
        0, cell_group, c_count * (c_mean - g_mean[cell_group]) ** 2) / k

    live = c_count > 0
    non_constant = live & (c_sq / c_count.clamp_min(1) > _CONSTANT_TOL) & (c_count > 1)
    san = normalized_advantages(r, segs.cell, segs.num_cells, eps, "population")
    in_var_san = segment_moments(san, segs.cell, segs.num_cells)[2] / c_count.clamp_min(1)
    glob_var_san = segment_moments(san, segs.group, segs.num_groups)[2] / k

    strata_per_prompt = torch.zeros_like(g_sq).index_add_(0, cell_group, live.to(r.dtype))
    out = {
        "sgrpo/var_adv_global": float(var_global.mean()),
        "sgrpo/var_adv_stratified": float(var_strat.mean()),
        "sgrpo/var_reduction": float((var_global - var_strat).mean()),
        "sgrpo/between_stratum_term": float(between.mean()),
        "sgrpo/in_stratum_var_san": _mean_over(in_var_san, non_constant),
        "sgrpo/global_var_san": float(glob_var_san.mean()),
        "sgrpo/strata_per_prompt": float(strata_per_prompt.mean()),
        "sgrpo/singleton_strata_share": float((c_count == 1).sum() / live.sum()),
        "sgrpo/constant_group_share": float((g_sq / g_count <= _CONSTANT_TOL).to(r.dtype).mean()),
    }
    if advantages is not None:
        a = advantages.to(torch.float64).reshape(-1)
        out["sgrpo/in_stratum_var_adv"] = _mean_over(
            segment_moments(a, segs.cell, segs.num_cells)[2] / c_count.clamp_min(1), non_constant)
        out["sgrpo/global_var_adv"] = float((segment_moments(a, segs.group, segs.num_groups)[2] / k).mean())
    return out


def _cell_group(segs) -> torch.Tensor:
    """Prompt index of every (prompt, stratum) cell, empty cells included."""
    cell_group = torch.zeros(segs.num_cells, dtype=torch.long, device=segs.group.device)
    return cell_group.index_copy_(0, segs.cell, segs.group)
