"""The GRPO vs Stratified GRPO study: seeds x arms on the demo's task, one table and one plot.

For each seed, one demo run (``python -m openrlhf_sgrpo.demo --arms ...``: one warm-up, then every
arm trained from the same warm-up weights, questions and number of steps) in ``OUT/seed_<s>``, the
seeds' runs side by side as processes (``demo/study_runner.py``); then the held-out numbers after
RL of every (seed, arm) are put in one table (mean ± standard deviation over seeds) and the
training curves (mean over seeds) in one figure, for this session. Each finished seed is also
exported as a small seed folder (``demo/study_seeds.py``) that is committed and aggregated over
sessions by ``demo/study_report.py``. Meant for a GPU (``examples/study/sgrpo_vs_grpo.py`` has the
settings); ``--smoke`` runs it tiny on a CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from openrlhf_sgrpo.demo.environment import environment
from openrlhf_sgrpo.eval.table import format_table

# GRPO, Stratified GRPO, and its control: the same estimator over random strata of the same sizes
DEFAULT_ARMS = "grpo,sgrpo:0.8,random:0.8"
# (column, key of the held-out summary after RL)
TABLE_KEYS = (("EM 1-hop", "hop1/em"), ("EM 2-hop", "hop2/em"), ("F1 2-hop", "hop2/f1"),
              ("searches/q 2-hop", "hop2/search_calls"), ("2-search share 2-hop", "hop2/two_search_share"),
              ("answered", "answered"))
# (train metrics key, panel title)
CURVE_KEYS = (("reward", "reward"), ("hop2/em", "EM on two-hop prompts"),
              ("hop2/two_search_share", "two-search share on two-hop prompts"),
              ("sgrpo/strata_per_prompt", "strata per prompt"))


def _stats(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def summarize(results: dict[int, dict]) -> dict[str, dict]:
    """Per arm: n seeds, and mean/std over seeds of every TABLE_KEYS metric and the last step's reward."""
    arms: dict[str, dict[str, list[float]]] = {}
    for res in results.values():
        for label, after in res["arms"].items():
            cell = arms.setdefault(label, {})
            for _, key in TABLE_KEYS:  # an arm cut off before its evaluation has no held-out numbers
                cell.setdefault(key, []).append((after or {}).get(key))
            last = res["steps"][label][-1] if res["steps"][label] else {}
            cell.setdefault("final_reward", []).append(last.get("reward"))
    return {label: {"seeds": len(next(iter(cells.values()))),
                    **{key: _stats(vals) for key, vals in cells.items()}} for label, cells in arms.items()}


def study_table(summary: dict[str, dict], warmup: dict[str, float] | None = None) -> str:
    """One row per arm (and the warm-up's starting point), mean ± std over seeds."""
    cell = lambda ms: "nan" if math.isnan(ms[0]) else f"{ms[0]:.3f} ± {ms[1]:.3f}"  # noqa: E731
    rows = []
    if warmup:
        rows.append(["after warm-up (start)", warmup["seeds"], *(cell(warmup[k]) for _, k in TABLE_KEYS), "-"])
    for label, s in summary.items():
        rows.append([label, s["seeds"], *(cell(s[k]) for _, k in TABLE_KEYS), cell(s["final_reward"])])
    return format_table(["held-out after RL", "seeds", *(c for c, _ in TABLE_KEYS), "last-step reward"], rows)


def warmup_summary(results: dict[int, dict]) -> dict | None:
    cols = [r["after_warmup"] for r in results.values() if r.get("after_warmup")]
    if not cols:
        return None
    return {"seeds": len(cols), **{k: _stats([c.get(k) for c in cols]) for _, k in TABLE_KEYS}}


def plot_study(results: dict[int, dict], path: Path) -> Path:
    """Training curves, mean over seeds per arm (a shaded band: ± one standard deviation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVE_KEYS), figsize=(4.2 * len(CURVE_KEYS), 3.6))
    labels = list(next(iter(results.values()))["steps"])
    for ax, (key, title) in zip(axes, CURVE_KEYS):
        for label in labels:
            by_step: dict[int, list[float]] = {}
            for res in results.values():
                for r in res["steps"].get(label, []):
                    v = r.get(key)
                    if v is not None and not math.isnan(float(v)):
                        by_step.setdefault(r["step"], []).append(float(v))
            steps = sorted(by_step)
            if not steps:
                continue
            means = [_stats(by_step[s])[0] for s in steps]
            stds = [_stats(by_step[s])[1] for s in steps]
            ax.plot(steps, means, label=label, lw=1.4)
            ax.fill_between(steps, [m - d for m, d in zip(means, stds)], [m + d for m, d in zip(means, stds)],
                            alpha=0.15)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"GRPO vs Stratified GRPO, {len(results)} seed(s), mean ± std", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_study(results: dict[int, dict], out: Path, argv: list[str], extra: dict | None = None) -> str:
    """``study_table.md``, ``study.png`` and ``study.json`` under ``out``; returns the table."""
    summary = summarize(results)
    table = study_table(summary, warmup_summary(results))
    out.mkdir(parents=True, exist_ok=True)
    (out / "study_table.md").write_text(table + "\n")
    plot_study(results, out / "study.png")
    (out / "study.json").write_text(json.dumps({
        "argv": argv, "environment": (extra or {}).get("environment") or environment(), "seeds": sorted(results),
        "summary": {label: {k: list(v) if isinstance(v, tuple) else v for k, v in s.items()}
                    for label, s in summary.items()},
        "per_seed": {str(seed): {"after_warmup": r["after_warmup"], "arms": r["arms"]} for seed, r in results.items()},
        **(extra or {}),
    }, indent=1))
    return table
