"""``python -m openrlhf_sgrpo.cli.tb_summary TB_DIR``: a cluster run's per-step table from its TensorBoard log.

OpenRLHF's ``TensorboardLogger`` writes every step's status under ``train/<key>`` (the info keys
our agent and experience maker add: ``reward``, ``tool_calls``, ``sgrpo/*``, ``sapo/*``,
``calibadv/*``). This prints them per step and, with ``--steps`` / ``--require``, exits 1 when a
step or a monitor is missing, so a smoke run fails loudly instead of printing a short table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_COLUMNS = ("reward", "tool_calls", "search_calls", "answered", "sgrpo/strata_per_prompt",
                   "sgrpo/var_reduction", "sgrpo/between_stratum_term", "sgrpo/in_stratum_var_san",
                   "sapo/penalized_share", "sapo/term", "calibadv/mean_turn_score", "policy_loss")


def read_scalars(tb_dir: str | Path) -> dict[str, dict[int, float]]:
    """``train/<key>`` scalars of every event file under ``tb_dir``: key -> {step: value}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted(Path(tb_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            if tag.startswith("train/"):
                series = out.setdefault(tag[len("train/"):], {})
                series.update({int(e.step): float(e.value) for e in acc.Scalars(tag)})
    return out


def table(scalars: dict[str, dict[int, float]], columns: tuple[str, ...] = DEFAULT_COLUMNS) -> str:
    """A markdown table: one row per logged step, the columns that were logged."""
    cols = [c for c in columns if c in scalars]
    steps = sorted({s for series in scalars.values() for s in series})
    lines = ["| step | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for step in steps:
        cells = [f"{scalars[c][step]:.4f}" if step in scalars[c] else "-" for c in cols]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def problems(scalars: dict[str, dict[int, float]], steps: int | None, require: list[str]) -> list[str]:
    """Missing steps or required keys (each named), empty when the run logged what it should."""
    found = sorted({s for series in scalars.values() for s in series})
    out = []
    if steps is not None and found != list(range(1, steps + 1)):
        out.append(f"expected steps 1..{steps}, the log has {found}")
    for key in require:
        logged = sorted(scalars.get(key, {}))
        if steps is not None and logged != list(range(1, steps + 1)):
            out.append(f"train/{key} logged at steps {logged}, expected 1..{steps}")
        elif not logged:
            out.append(f"train/{key} never logged")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.cli.tb_summary", description=__doc__)
    p.add_argument("tb_dir", help="the run's --logger.tensorboard_dir")
    p.add_argument("--steps", type=int, help="fail unless exactly steps 1..N were logged")
    p.add_argument("--require", action="append", default=[], help="a train/<key> every step must log")
    a = p.parse_args(argv)
    if not Path(a.tb_dir).is_dir():
        print(f"error: {a.tb_dir} is not a folder", file=sys.stderr)
        return 2
    scalars = read_scalars(a.tb_dir)
    print(table(scalars))
    found = problems(scalars, a.steps, a.require)
    for msg in found:
        print(f"error: {msg}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
