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

    @property
    def predictions(self) -> Path:
        return self.dir / "eval_predictions.jsonl"


def parse_arms(spec: str) -> list[tuple[str, float]]:
    """``grpo,sgrpo:0.6,sgrpo:1.0`` -> [(estimator, alpha), ...] (ValueError naming a bad item)."""
    arms = []
    for item in (s.strip() for s in spec.split(",")):
        name, _, alpha = item.partition(":")
        if name == "grpo" and not alpha:
            arms.append(("grpo", 0.0))
            continue
        try:
            value = float(alpha)
        except ValueError:
            value = None
        if name != "sgrpo" or value is None or not 0.0 <= value <= 1.0:
            raise ValueError(f"--arms item {item!r}: write grpo or sgrpo:ALPHA with ALPHA in [0, 1]")
        arms.append(("stratified_grpo", value))
    if len(set(arms)) != len(arms):
        raise ValueError(f"--arms {spec!r} names an arm twice")
    return arms


def arms_for(args) -> list[Arm]:
    """The arms a run trains, in order: ``--arms``, the two of ``--compare``, or the one of the
    plain demo."""
    out = Path(args.out)
    if getattr(args, "arms", None):
        return [Arm("GRPO", "grpo", 0.0, out / "grpo") if est == "grpo" else
                Arm(f"Stratified GRPO (alpha {a:g})", est, a, out / f"sgrpo_a{a:g}") for est, a in parse_arms(args.arms)]
    if not args.compare:
        label = "GRPO" if args.estimator == "grpo" else f"{args.estimator} (alpha {args.alpha:g})"
        return [Arm(label, args.estimator, args.alpha, out)]
    return [Arm("GRPO", "grpo", 0.0, out / "grpo"),
            Arm(f"Stratified GRPO (alpha {args.alpha:g})", "stratified_grpo", args.alpha, out / "sgrpo")]

