"""Per-step time split of a cluster run: generation, tool wait, experience making, training, weight sync.

OpenRLHF 0.11.2's ``PPOTrainer.fit`` already times four phases of every step and logs them with
the step's status (``train/timing/generation``, ``make_experience``, ``ppo_train``, ``broadcast``,
``step_total``; the weight sync to vLLM is ``broadcast``). What it cannot see is how much of the
generation phase the agents spent waiting on their tools: the tool calls run inside the engine
actors. :class:`ToolIntervals` records each retriever request's wall-clock span where the service
runs (a WSGI wrapper, in the process that serves it), and :func:`step_rows` places those spans in
each step's generation window, read back from the TensorBoard log: the step's event is written
just after the step ends, so the window is ``[wall - step_total, wall - step_total + generation]``.
``tool_wait_s`` is the time with at least one call in flight (what the rollout could have lost),
``tool_sum_s`` the calls' summed latency.

    python -m openrlhf_sgrpo.cli.step_times TB_DIR [--tool-spans FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

PHASES = ("generation", "make_experience", "ppo_train", "broadcast", "step_total")
COLUMNS = ("generation", "tool_wait", "tool_sum", "tool_calls", "make_experience", "ppo_train",
           "broadcast", "step_total")


class ToolIntervals:
    """Wall-clock ``(start, end)`` of every request a WSGI app served (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[tuple[float, float]] = []

    def wrap(self, app: Callable) -> Callable:
        """``app`` timed from the request's arrival until its body is produced."""

        def timed(environ: dict, start_response: Callable) -> Iterable[bytes]:
            start = time.time()
            result = app(environ, start_response)
            try:
                return list(result)
            finally:
                close = getattr(result, "close", None)  # werkzeug's teardown runs on close
                if close is not None:
                    close()
                with self._lock:
                    self.spans.append((start, time.time()))

        return timed

    def take(self) -> list[tuple[float, float]]:
        """The spans recorded so far, which are then forgotten (one run's worth)."""
        with self._lock:
            spans, self.spans = self.spans, []
        return spans


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of the spans: the time with at least one in flight."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def read_phases(tb_dir: str | Path) -> dict[int, dict[str, float]]:
    """Per step: OpenRLHF's ``timing/*`` seconds and ``wall``, the time its status was logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps: dict[int, dict[str, float]] = {}
    for events in sorted(Path(tb_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        acc.Reload()
        for phase in PHASES:
            tag = f"train/timing/{phase}"
            if tag in acc.Tags().get("scalars", []):
                for e in acc.Scalars(tag):
                    row = steps.setdefault(int(e.step), {})
                    row[phase] = float(e.value)
                    row["wall"] = max(row.get("wall", 0.0), float(e.wall_time))
    return steps


def step_rows(phases: dict[int, dict[str, float]], spans: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """One row per step: the phases and the tool spans clipped to the step's generation window."""
    rows = []
    for step in sorted(phases):
        p = phases[step]
        row: dict[str, Any] = {"step": step, **{k: p.get(k) for k in PHASES}}
        if "wall" in p and p.get("step_total") is not None and p.get("generation") is not None:
            lo = p["wall"] - p["step_total"]
            hi = lo + p["generation"]
            inside = [(max(a, lo), min(b, hi)) for a, b in spans if b > lo and a < hi]
            row.update(tool_wait=union_seconds(inside), tool_sum=sum(b - a for a, b in inside),
                       tool_calls=len(inside))
        rows.append(row)
    return rows


def split_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: seconds per phase and step (``-`` where a value is missing)."""
    lines = ["| step | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row in rows:
        cells = ["-" if row.get(c) is None else (str(row[c]) if c == "tool_calls" else f"{row[c]:.2f}")
                 for c in COLUMNS]
        lines.append(f"| {row['step']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.cli.step_times", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tb_dir", help="the run's --logger.tensorboard_dir")
    p.add_argument("--tool-spans", help="jsonl of [start, end] wall-clock seconds per tool call")
    a = p.parse_args(argv)
    if not Path(a.tb_dir).is_dir():
        print(f"error: {a.tb_dir} is not a folder", file=sys.stderr)
        return 2
    spans = []
    if a.tool_spans:
        spans = [tuple(json.loads(line)) for line in Path(a.tool_spans).read_text().splitlines() if line.strip()]
    rows = step_rows(read_phases(a.tb_dir), spans)
    if not rows:
        print(f"error: no train/timing/* in {a.tb_dir}", file=sys.stderr)
        return 1
    print(split_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
