"""Training arms: the plain demo trains one (Stratified GRPO by default); ``--compare`` trains GRPO
and Stratified GRPO from the same warm-up weights, seed, questions and number of steps.

Each arm of a comparison lives in its own folder under the run (``grpo/``, ``sgrpo/``: its
checkpoints, ``metrics.jsonl``, rollout records, held-out predictions and ``rollouts.html``), so
``--resume`` continues whichever arm was cut short and the inspector opens either one. The plain
demo's one arm is the run folder itself (the layout the demo always had).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Arm:
    label: str  # the column / legend name
    estimator: str
    alpha: float
    dir: Path
    stratify_by: str | None = None  # None: the run's --stratify-by; the random-strata arm names its own

    @property
    def predictions(self) -> Path:
        return self.dir / "eval_predictions.jsonl"


RANDOM_STRATA = "random:tool_calls"  # strata of the tool-call counts' sizes, members drawn at random


def parse_arms(spec: str) -> list[tuple[str, float, str | None]]:
    """``grpo,sgrpo:0.8,random:0.8`` -> [(estimator, alpha, stratify_by), ...] (ValueError naming a
    bad item). ``random:ALPHA`` is Stratified GRPO over random strata (``random:tool_calls``): the
    control that tells whether stratifying *by search count* is what helps, or any split would."""
    arms = []
    for item in (s.strip() for s in spec.split(",")):
        name, _, alpha = item.partition(":")
        if name == "grpo" and not alpha:
            arms.append(("grpo", 0.0, None))
            continue
        try:
            value = float(alpha)
        except ValueError:
            value = None
        if name not in ("sgrpo", "random") or value is None or not 0.0 <= value <= 1.0:
            raise ValueError(f"--arms item {item!r}: write grpo, sgrpo:ALPHA or random:ALPHA with ALPHA in [0, 1]")
        arms.append(("stratified_grpo", value, RANDOM_STRATA if name == "random" else None))
    if len(set(arms)) != len(arms):
        raise ValueError(f"--arms {spec!r} names an arm twice")
    return arms


def _arm(out: Path, estimator: str, alpha: float, stratify_by: str | None) -> Arm:
    if estimator == "grpo":
        return Arm("GRPO", "grpo", 0.0, out / "grpo")
    if stratify_by == RANDOM_STRATA:
        return Arm(f"Random strata (alpha {alpha:g})", estimator, alpha, out / f"random_a{alpha:g}", stratify_by)
    return Arm(f"Stratified GRPO (alpha {alpha:g})", estimator, alpha, out / f"sgrpo_a{alpha:g}")


def arms_for(args) -> list[Arm]:
    """The arms a run trains, in order: ``--arms``, the two of ``--compare``, or the one of the
    plain demo."""
    out = Path(args.out)
    if getattr(args, "arms", None):
        return [_arm(out, *arm) for arm in parse_arms(args.arms)]
    if not args.compare:
        label = "GRPO" if args.estimator == "grpo" else f"{args.estimator} (alpha {args.alpha:g})"
        return [Arm(label, args.estimator, args.alpha, out)]
    return [Arm("GRPO", "grpo", 0.0, out / "grpo"),
            Arm(f"Stratified GRPO (alpha {args.alpha:g})", "stratified_grpo", args.alpha, out / "sgrpo")]

