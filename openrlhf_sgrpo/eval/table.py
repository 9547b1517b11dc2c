"""Plain-text tables for the terminal and the README (no dependency, fixed-width columns)."""

from __future__ import annotations


def format_table(headers: list[str], rows: list[list], floatfmt: str = "{:.3f}") -> str:
    cells = [[floatfmt.format(c) if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in cells)])


def qa_table(summaries: dict[str, dict]) -> str:
    """One row per dataset: N, EM, F1, search calls per question."""
    rows = [[name, s["n"], s["em"], s["f1"], s["search_calls"]] for name, s in summaries.items()]
    return format_table(["dataset", "N", "EM", "F1", "search calls/q"], rows)


def gaia_table(by_level: dict[str, dict]) -> str:
    rows = [[level, s["n"], s["accuracy"], s["search_calls"], s["code_calls"]] for level, s in by_level.items()]
    return format_table(["level", "N", "accuracy", "search calls/q", "code calls/q"], rows)
