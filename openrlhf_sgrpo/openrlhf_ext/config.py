"""Our options inside OpenRLHF's hierarchized args, read in one place with safe defaults.

The CLI adds ``--algo.advantage.sgrpo_alpha`` and friends; code that runs inside Ray workers
reads them through :func:`sgrpo_options` so a run started without our CLI (only the worker
hook) still gets documented defaults instead of an AttributeError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openrlhf_sgrpo.advantages import STRATIFIED_ESTIMATORS
from openrlhf_sgrpo.strata import DEFAULT_STRATIFY_BY

DEFAULT_ALPHA = 0.6  # the paper's base-model setting (0.8 for instruct models)
DEFAULT_EPS = 1e-6
DEFAULT_STD = "population"


@dataclass(frozen=True)
class SGRPOOptions:
    """What the stratified estimators need from the run's args."""

    estimator: str
    alpha: float
    eps: float
    std: str
    stratify_by: str
    strata_cap: int | None

    @property
    def is_stratified(self) -> bool:
        return self.estimator in STRATIFIED_ESTIMATORS


def sgrpo_options(args: Any) -> SGRPOOptions:
    adv = args.algo.advantage
    return SGRPOOptions(
        estimator=adv.estimator,
        alpha=float(getattr(adv, "sgrpo_alpha", DEFAULT_ALPHA)),
        eps=float(getattr(adv, "sgrpo_eps", DEFAULT_EPS)),
        std=getattr(adv, "sgrpo_std", DEFAULT_STD),
        stratify_by=getattr(adv, "stratify_by", DEFAULT_STRATIFY_BY),
        strata_cap=getattr(adv, "strata_cap", None),
    )
