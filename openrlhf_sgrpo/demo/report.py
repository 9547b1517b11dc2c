"""The demo's report: a before/after table, reward per step, and ``report.png``."""

from __future__ import annotations

import math
from pathlib import Path

from openrlhf_sgrpo.eval.table import format_table

PLOTS = (("reward", "reward (mean of samples)"), ("search_calls", "search calls per trajectory"),
         ("sgrpo/in_stratum_var_adv", "in-stratum advantage variance"))


def before_after_table(before: dict, after: dict, after_warmup: dict | None = None) -> str:
    """Held-out metrics before training, after the format warm-up (when known), and after RL."""
    columns = [before, after] if after_warmup is None else [before, after_warmup, after]
    heads = ["before", "after"] if after_warmup is None else ["before", "after warm-up", "after RL"]
    rows = [[name, *(c[key] for c in columns)] for name, key in
            (("EM", "em"), ("F1", "f1"), ("search calls / question", "search_calls"), ("answered", "answered"))]
    return format_table(["held-out metric", *heads], rows)


def steps_table(records: list[dict]) -> str:
    rows = [[r["step"], r["reward"], r["em"], r["search_calls"], r.get("sgrpo/strata_per_prompt") or 0.0,
             _num(r.get("sgrpo/in_stratum_var_adv")), r.get("time/rollout_wall_s", 0.0), r.get("time/update_s", 0.0)]
            for r in records]
    return format_table(["step", "reward", "EM", "search/traj", "strata/prompt", "in-stratum var A",
                         "rollout s", "update s"], rows)


def _num(value) -> float:
    return float("nan") if value is None else float(value)


def plot_report(records: list[dict], path: str | Path, title: str = "Stratified GRPO (local demo)") -> Path:
    """Three panels over training steps; NaN points (no non-constant stratum) are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOTS), figsize=(4.2 * len(PLOTS), 3.4))
    steps = [r["step"] for r in records]
    for ax, (key, label) in zip(axes, PLOTS):
        pts = [(s, _num(r.get(key))) for s, r in zip(steps, records)]
        pts = [(s, v) for s, v in pts if not math.isnan(v)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        else:
            ax.text(0.5, 0.5, "no data (all strata constant)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
