"""The demo's report: held-out metrics by hop per stage, per-step training metrics, and plots.

One code path serves the plain demo (one training arm) and ``--compare`` (GRPO beside Stratified
GRPO): every table and figure takes named columns / named arms.
"""

from __future__ import annotations

import math
from pathlib import Path

from openrlhf_sgrpo.eval.table import format_table

# (label, key in a hops.by_hop summary): the held-out rows, one-hop then two-hop.
HELDOUT_ROWS = (
    ("EM one-hop", "hop1/em"), ("EM two-hop", "hop2/em"), ("F1 one-hop", "hop1/f1"), ("F1 two-hop", "hop2/f1"),
    ("searches / question one-hop", "hop1/search_calls"), ("searches / question two-hop", "hop2/search_calls"),
    ("two-search share, two-hop", "hop2/two_search_share"), ("answered", "answered"),
)
FALLBACK_ROWS = (("EM", "em"), ("F1", "f1"), ("search calls / question", "search_calls"), ("answered", "answered"))

# (metrics key, panel title, second key drawn dashed in the same panel or None)
CURVES = (
    ("reward", "reward (mean of samples)", None),
    ("hop1/em", "EM: one-hop (solid), two-hop (dashed)", "hop2/em"),
    ("search_calls", "searches per trajectory", None),
    ("hop2/two_search_share", "two-search share on two-hop prompts", None),
    ("sgrpo/strata_per_prompt", "strata per prompt", None),
    ("sgrpo/in_stratum_var_adv", "in-stratum advantage variance", None),
)


def heldout_table(columns: dict[str, dict | None]) -> str:
    """One row per metric, one column per stage (``None`` columns are left out). Rows by hop when
    the summaries have them (the generated task), else the plain EM/F1/search/answered rows."""
    live = {name: c for name, c in columns.items() if c is not None}
    first = next(iter(live.values()))
    rows_spec = HELDOUT_ROWS if "hop2/em" in first else FALLBACK_ROWS
    counts = ", ".join(f"{int(first[f'hop{h}/n'])} {w}-hop" for h, w in ((1, "one"), (2, "two"))
                       if f"hop{h}/n" in first)
    head = f"held-out metric ({int(first['n'])} questions{': ' + counts if counts else ''})"
    rows = [[label, *(_num(c.get(key)) for c in live.values())] for label, key in rows_spec]
    return format_table([head, *live], rows)


def steps_table(records: list[dict]) -> str:
    rows = [[r["step"], r["reward"], _num(r.get("hop1/em")), _num(r.get("hop2/em")), r["search_calls"],
             _num(r.get("hop2/two_search_share")), r.get("sgrpo/strata_per_prompt") or 0.0,
             _num(r.get("sgrpo/in_stratum_var_adv")), r.get("time/rollout_wall_s", 0.0), r.get("time/update_s", 0.0)]
            for r in records]
    return format_table(["step", "reward", "EM 1-hop", "EM 2-hop", "search/traj", "2-search (2-hop)",
                         "strata/prompt", "in-stratum var A", "rollout s", "update s"], rows)


def _num(value) -> float:
    return float("nan") if value is None else float(value)


def plot_curves(arms: dict[str, list[dict]], path: str | Path, title: str) -> Path:
    """Training curves over steps, one line (colour) per arm; NaN points are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 6.6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, label, dashed) in zip(axes.flat, CURVES):
        drawn = False
        for colour, (arm, records) in zip(colours, arms.items()):
            for k, style in ((key, "-"), (dashed, "--")):
                if k is None:
                    continue
                pts = [(r["step"], _num(r.get(k))) for r in records]
                pts = [(s, v) for s, v in pts if not math.isnan(v)]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, color=colour,
                            label=arm if style == "-" else None)
                    drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    if len(arms) > 1:
        axes.flat[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
