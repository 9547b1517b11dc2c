"""Batch order vs prompt order of OpenRLHF experiences, and the info key of our scalar advantage.

OpenRLHF's experiences come in batches whose rows are samples from anywhere in the rollout;
``Experience.index`` says which. Estimators and CalibAdv work per prompt group, so they gather
values into prompt order (the samples of one prompt contiguous, ``n_samples_per_prompt`` each)
and scatter results back. The experience maker, the CalibAdv hook and the rollout dump all use
these two functions; they live here, apart from any of them, so none has to import another.
"""

from __future__ import annotations

import itertools

import torch

# Per-sample info key holding the scalar (pre-KL) stratified advantage, for logs and tests.
ADVANTAGE_INFO_KEY = "sgrpo_advantage"


def _prompt_positions(experiences: list) -> torch.Tensor:
    """Each batch row's position in prompt order (``experience.index``, batches concatenated)."""
    return torch.tensor(list(itertools.chain.from_iterable(e.index for e in experiences)))


def prompt_ordered(experiences: list, per_sample: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate per-experience values and put them in prompt order (``experience.index``)."""
    flat = torch.cat(per_sample, dim=0)
    ordered = torch.empty_like(flat)
    ordered[_prompt_positions(experiences)] = flat
    return ordered


def batch_order(experiences: list, ordered: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Inverse of :func:`prompt_ordered`: split prompt-ordered values back per experience."""
    return ordered[_prompt_positions(experiences)].split([len(e.index) for e in experiences])
