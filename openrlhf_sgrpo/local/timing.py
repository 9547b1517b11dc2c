"""Where rollout time goes: intervals of generate calls and tool calls, and their overlap.

The rollout is asynchronous: many trajectories generate and call tools at once. Summing
latencies says how much work there was; the *union* of intervals says how much wall time it
occupied; tool time not covered by any generate call is the wall time tools really cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

Interval = tuple[float, float]


def union_length(intervals: list[Interval]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def uncovered_length(intervals: list[Interval], cover: list[Interval]) -> float:
    """Length of the union of ``intervals`` that no interval of ``cover`` overlaps."""
    return union_length(intervals + cover) - union_length(cover)


@dataclass
class IntervalRecorder:
    """Per-kind (start, end) intervals on the monotonic clock."""

    spans: dict[str, list[Interval]] = field(default_factory=dict)

    def add(self, kind: str, start: float, end: float) -> None:
        self.spans.setdefault(kind, []).append((start, end))

    def get(self, kind: str) -> list[Interval]:
        return self.spans.get(kind, [])

    def clear(self) -> None:
        self.spans.clear()


def rollout_timing(rec: IntervalRecorder, wall_s: float, tool_kinds: tuple[str, ...] = ("search", "code")) -> dict:
    """Summary numbers for one rollout (see bench/rollout_breakdown.py for how they are used)."""
    tools = [iv for k in tool_kinds for iv in rec.get(k)]
    gen = rec.get("generate")
    tool_sum = sum(b - a for a, b in tools)
    exposed = uncovered_length(tools, gen)
    return {
        "time/rollout_wall_s": wall_s,
        "time/generate_busy_s": union_length(gen),
        "time/tool_latency_sum_s": tool_sum,
        "time/tool_wall_s": union_length(tools),
        "time/tool_exposed_s": exposed,
        "time/tool_calls": len(tools),
        # < 1 means tool calls overlapped each other and/or generation.
        "time/tool_exposed_over_sum": exposed / tool_sum if tool_sum > 0 else 0.0,
        "time/wall_over_tool_sum": wall_s / tool_sum if tool_sum > 0 else float("nan"),
    }


class Stopwatch:
    """``with Stopwatch() as sw: ...; sw.seconds``."""

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.start
