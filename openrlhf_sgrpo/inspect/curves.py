"""Headline curves from ``metrics.jsonl`` as inline SVG (no plotting library, no network)."""

from __future__ import annotations

import math
from html import escape

# (metrics key, title), drawn when the run logged the key (local/trainer.py's step record).
CURVES: tuple[tuple[str, str], ...] = (
    ("reward", "reward"),
    ("em", "exact match"),
    # by hop count, where the run knows it (the demo's generated task: demo/hops.py)
    ("hop1/em", "EM, one-hop prompts"),
    ("hop2/em", "EM, two-hop prompts"),
    ("hop2/two_search_share", "two searches, two-hop prompts"),
    ("tool_calls", "tool calls / trajectory"),
    ("sgrpo/strata_per_prompt", "strata per prompt"),
    ("sgrpo/constant_group_share", "no-variance groups"),
    ("sgrpo/in_stratum_var_adv", "in-stratum var(A)"),
)
WIDTH, HEIGHT = 196, 112
LEFT, RIGHT, TOP, BOTTOM = 36, 8, 20, 22


def series(rows: list[dict], key: str, phase: str = "train") -> list[tuple[float, float]]:
    """(step, value) of one metric, finite values only, in step order (last write of a step wins)."""
    points: dict[float, float] = {}
    for row in rows:
        value, step = row.get(key), row.get("step")
        if row.get("phase", "train") != phase or isinstance(value, bool) or isinstance(step, bool):
            continue
        if isinstance(value, (int, float)) and isinstance(step, (int, float)) and math.isfinite(value):
            points[float(step)] = float(value)
    return sorted(points.items())


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def curve_svg(key: str, title: str, points: list[tuple[float, float]]) -> str:
    """One small chart; ``data-*`` on the svg let the page move its selected-step marker."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo, y_hi = min(ys), max(ys)
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    px = lambda x: LEFT + (x - x_lo) / (x_hi - x_lo) * pw
    py = lambda y: TOP + (1 - (y - y_lo) / (y_hi - y_lo)) * ph
    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5"><title>step {_fmt(x)}: {_fmt(y)}</title>'
                   f'</circle>' for x, y in points)
    return (
        f'<svg class="curve" data-key="{escape(key)}" data-x0="{LEFT}" data-x1="{LEFT + pw}" data-smin="{x_lo}" '
        f'data-smax="{x_hi}" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(title)}">'
        f'<text x="6" y="14" class="ctitle">{escape(title)}</text>'
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" class="frame"/>'
        f'<text x="{LEFT - 4}" y="{TOP + 8}" class="ylab">{_fmt(y_hi)}</text>'
        f'<text x="{LEFT - 4}" y="{TOP + ph}" class="ylab">{_fmt(y_lo)}</text>'
        f'<text x="{LEFT}" y="{HEIGHT - 8}" class="xlab">{_fmt(x_lo)}</text>'
        f'<text x="{LEFT + pw}" y="{HEIGHT - 8}" class="xlab end">step {_fmt(x_hi)}</text>'
        f'<line class="step-marker" x1="-10" x2="-10" y1="{TOP}" y2="{TOP + ph}"/>'
        f'<polyline points="{line}" class="series"/>{dots}</svg>'
    )


def curves_html(rows: list[dict]) -> str:
    """All headline charts the run's metrics allow ('' when it logged none)."""
    charts = [curve_svg(key, title, pts) for key, title in CURVES if (pts := series(rows, key))]
    return "".join(charts)
