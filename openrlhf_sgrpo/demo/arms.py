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


def arms_for(args) -> list[Arm]:
    """The arms a run trains, in order."""
    out = Path(args.out)
    if not args.compare:
        label = "GRPO" if args.estimator == "grpo" else f"{args.estimator} (alpha {args.alpha:g})"
        return [Arm(label, args.estimator, args.alpha, out)]
    return [Arm("GRPO", "grpo", 0.0, out / "grpo"),
            Arm(f"Stratified GRPO (alpha {args.alpha:g})", "stratified_grpo", args.alpha, out / "sgrpo")]

