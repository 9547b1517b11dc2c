"""Regenerate the study's table and figure from every committed seed folder.

    python -m openrlhf_sgrpo.demo.study_report --results docs/study/seeds --out docs/study

Why regenerate instead of edit: each lent GPU session adds seed folders (``study_seeds.py``), and
the numbers over seeds are then recomputed from all of them, never typed (DESIGN.md, "Evidence
that accumulates"). Writes ``OUT/table.md`` (per arm: seeds, and over seeds mean ± sample std and
a 95 % t-interval of held-out EM 1-hop / 2-hop, searches per question, two-search share on two-hop
questions, the last step's training reward; then the seconds per training step of each arm per
session, which only compare within a session: same device, same number of processes at once) and
``OUT/figure.png`` (training reward, searches per question, two-search share: mean and a ± one
std band over seeds; and the mechanism: per step, the net advantage mass of the 1-search and
2-search strata, where the seeds logged ``sgrpo/stratum{k}/adv_mass``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from openrlhf_sgrpo.demo.study_seeds import SCHEMA
from openrlhf_sgrpo.eval.table import format_table

# two-sided 95 % quantiles of Student's t, df 1..30 (t_{0.975, df}); beyond, a Cornish-Fisher expansion
_T975 = (12.7062047, 4.3026527, 3.1824463, 2.7764451, 2.5705818, 2.4469119, 2.3646243, 2.3060041, 2.2621572,
         2.2281389, 2.2009852, 2.1788128, 2.1603687, 2.1447867, 2.1314495, 2.1199053, 2.1098155, 2.1009220,
         2.0930241, 2.0859634, 2.0796138, 2.0738731, 2.0686576, 2.0638986, 2.0595386, 2.0555294, 2.0518305,
         2.0484071, 2.0452296, 2.0422725)
# (column, where the seed's value comes from: ("heldout", key) after RL, or ("last_step", key))
COLUMNS = (("EM 1-hop", ("heldout", "hop1/em")), ("EM 2-hop", ("heldout", "hop2/em")),
           ("searches/q", ("heldout", "search_calls")), ("two-search share 2-hop", ("heldout", "hop2/two_search_share")),
           ("last-step reward", ("last_step", "reward")))
# (step key, panel title) of the figure's curves
CURVES = (("reward", "training reward"), ("search_calls", "searches per question (training)"),
          ("hop2/two_search_share", "two-search share, two-hop prompts"))


class SeedFolderError(ValueError):
    """A seed folder that is missing or not in the committed form; the message names it."""


def t975(df: int) -> float:
    """Student's t quantile 0.975 with ``df`` degrees of freedom (the 95 % interval's factor)."""
    if df < 1:
        raise ValueError(f"a t interval needs >= 1 degree of freedom, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959963984540054
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))  # < 1e-6 relative for df > 30


def stats(values: list[float]) -> dict:
    """n, mean, sample std (n - 1) and the 95 % t-interval of the mean; std and interval are NaN
    for one value (one seed says nothing about the spread)."""
    values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": math.nan, "std": math.nan, "lo": math.nan, "hi": math.nan}
    mean = statistics.fmean(values)
    if n == 1:
        return {"n": 1, "mean": mean, "std": math.nan, "lo": math.nan, "hi": math.nan}
    std = statistics.stdev(values)
    half = t975(n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "lo": mean - half, "hi": mean + half}


def read_seed(folder: Path) -> dict:
    """One seed folder (``seed.json`` + ``steps.jsonl``) checked and read; SeedFolderError naming
    the folder and what is wrong."""
    folder = Path(folder)
    meta_path, steps_path = folder / "seed.json", folder / "steps.jsonl"
    for p in (meta_path, steps_path):
        if not p.is_file():
            raise SeedFolderError(f"seed folder {folder}: {p.name} is missing")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as err:
        raise SeedFolderError(f"seed folder {folder}: seed.json is not JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise SeedFolderError(f"seed folder {folder}: seed.json has schema {meta.get('schema') if isinstance(meta, dict) else None!r}, "
                              f"expected {SCHEMA}")
    for key in ("session", "device", "seed", "arms"):
        if key not in meta:
            raise SeedFolderError(f"seed folder {folder}: seed.json lacks {key!r}")
    if not isinstance(meta["arms"], dict) or not meta["arms"]:
        raise SeedFolderError(f"seed folder {folder}: seed.json's 'arms' names no arm")
    steps: dict[str, list[dict]] = {label: [] for label in meta["arms"]}
    for i, line in enumerate(steps_path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            label, step = row["arm"], int(row["step"])
        except (ValueError, KeyError, TypeError):
            raise SeedFolderError(f"seed folder {folder}: steps.jsonl line {i} is not a step record "
                                  f"(JSON with 'arm' and 'step'): {line[:80]!r}") from None
        if label not in steps:
            raise SeedFolderError(f"seed folder {folder}: steps.jsonl line {i} names arm {label!r}, "
                                  f"not one of seed.json's {sorted(steps)}")
        steps[label].append({**row, "step": step})
    for rows in steps.values():
        rows.sort(key=lambda r: r["step"])
    return {"folder": folder.name, **meta, "steps": steps}


def read_seeds(results: Path) -> list[dict]:
    """Every seed folder under ``results`` (each subfolder is one; none is an error)."""
    results = Path(results)
    if not results.is_dir():
        raise SeedFolderError(f"--results {results}: no such folder")
    folders = sorted(p for p in results.iterdir() if p.is_dir())
    if not folders:
        raise SeedFolderError(f"--results {results}: holds no seed folder")
    return [read_seed(f) for f in folders]


def _value(seed: dict, label: str, source: tuple[str, str]) -> float | None:
    kind, key = source
    if kind == "heldout":
        return (seed["arms"][label].get("heldout") or {}).get(key)
    rows = seed["steps"].get(label) or []
    return rows[-1].get(key) if rows else None


def arm_labels(seeds: list[dict]) -> list[str]:
    """Arms in first-seen order over all seeds."""
    labels: list[str] = []
    for s in seeds:
        labels += [a for a in s["arms"] if a not in labels]
    return labels


def summarize(seeds: list[dict]) -> dict[str, dict[str, dict]]:
    """arm -> column -> :func:`stats` over the seeds that ran that arm."""
    return {label: {col: stats([_value(s, label, src) for s in seeds if label in s["arms"]]) for col, src in COLUMNS}
            for label in arm_labels(seeds)}


def step_times(seeds: list[dict]) -> dict[tuple[str, str], dict[str, dict]]:
    """(session, device) -> arm -> stats of each seed's mean seconds per training step."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for s in seeds:
        for label, rows in s["steps"].items():
            walls = [r["wall_s"] for r in rows if r.get("wall_s") is not None]
            if walls:
                out.setdefault((s["session"], s["device"]), {}).setdefault(label, []).append(statistics.fmean(walls))
    return {k: {label: stats(v) for label, v in arms.items()} for k, arms in out.items()}


def _cell(s: dict) -> str:
    if s["n"] == 0:
        return "-"
    if s["n"] == 1:
        return f"{s['mean']:.3f}"
    return f"{s['mean']:.3f} ± {s['std']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]"


def report_table(seeds: list[dict]) -> str:
    """The markdown the report writes: the arms' table and the per-session step times."""
    summary = summarize(seeds)
    # where every arm starts: the seeds' held-out numbers after the warm-up (no RL step yet)
    warm = {col: stats([(s.get("after_warmup") or {}).get(src[1]) for s in seeds]) if src[0] == "heldout" else None
            for col, src in COLUMNS}
    rows = [["after warm-up (start)", max(c["n"] for c in warm.values() if c), *(_cell(c) if c else "-"
                                                                                for c in warm.values())]]
    rows += [[label, max(c["n"] for c in cols.values()), *(_cell(cols[c]) for c, _ in COLUMNS)]
             for label, cols in summary.items()]
    head = format_table(["arm (held-out after RL)", "seeds", *(c for c, _ in COLUMNS)], rows)
    times = step_times(seeds)
    trows = [[session, device, label, s["n"], _cell(s)] for (session, device), arms in sorted(times.items())
             for label, s in arms.items()]
    sessions = sorted({(s["session"], s["device"]) for s in seeds})
    by_seed: dict[int, list[str]] = {}
    for s in seeds:
        by_seed.setdefault(s["seed"], []).append(s["folder"])
    # a seed run twice shares its warm-up data and draws: not two independent samples
    repeats = [f"note: seed {k} is in {len(f)} folders ({', '.join(f)}): repeated seeds are not independent draws; "
               "give a session new seeds (gpu_vllm_run.sh's default)" for k, f in sorted(by_seed.items()) if len(f) > 1]
    text = [f"{len(seeds)} seed folder(s) from {len(sessions)} session(s): "
            + ", ".join(f"{a} ({b})" for a, b in sessions) + ".",
            "Cells: mean over seeds ± sample std [95 % t-interval of the mean]; one seed: the value alone.",
            *repeats, "",
            head, "", "Seconds per training step (each seed's mean; compare arms within a session only):", "",
            format_table(["session", "device", "arm", "seeds", "s/step"], trows) if trows else "(no step times)"]
    return "\n".join(text)


def _band(seeds: list[dict], label: str, key: str) -> tuple[list[int], list[float], list[float]]:
    by_step: dict[int, list[float]] = {}
    for s in seeds:
        for r in s["steps"].get(label, []):
            v = r.get(key)
            if v is not None and not math.isnan(float(v)):
                by_step.setdefault(r["step"], []).append(float(v))
    steps = sorted(by_step)
    means = [statistics.fmean(by_step[k]) for k in steps]
    stds = [statistics.stdev(by_step[k]) if len(by_step[k]) > 1 else 0.0 for k in steps]
    return steps, means, stds


def plot(seeds: list[dict], path: Path) -> Path:
    """Figure 1 of the paper, our way: three training curves and the mechanism panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = arm_labels(seeds)
    fig, axes = plt.subplots(1, len(CURVES) + 1, figsize=(4.2 * (len(CURVES) + 1), 3.6))
    colors = {label: f"C{i}" for i, label in enumerate(labels)}
    for ax, (key, title) in zip(axes, CURVES):
        for label in labels:
            steps, means, stds = _band(seeds, label, key)
            if steps:
                ax.plot(steps, means, label=label, color=colors[label], lw=1.4)
                ax.fill_between(steps, [m - d for m, d in zip(means, stds)], [m + d for m, d in zip(means, stds)],
                                color=colors[label], alpha=0.15)
        ax.set_title(title, fontsize=9)
    mech = axes[-1]
    drawn = False
    for label in labels:
        for k, style in ((1, "-"), (2, "--")):
            steps, means, stds = _band(seeds, label, f"sgrpo/stratum{k}/adv_mass")
            if steps:
                drawn = True
                mech.plot(steps, means, style, color=colors[label], lw=1.2, label=f"{label}, {k} search(es)")
                mech.fill_between(steps, [m - d for m, d in zip(means, stds)], [m + d for m, d in zip(means, stds)],
                                  color=colors[label], alpha=0.1)
    mech.set_title("net advantage mass: 1-search (solid), 2-search (dashed)", fontsize=9)
    if drawn:
        mech.axhline(0.0, color="grey", lw=0.6)
        mech.legend(fontsize=6)
    else:
        mech.text(0.5, 0.5, "no sgrpo/stratum{k}/adv_mass\nin these seeds", ha="center", va="center",
                  transform=mech.transAxes, fontsize=8)
    for ax in axes:
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"GRPO vs Stratified GRPO: {len(seeds)} seed(s), mean ± std over seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(results: Path, out: Path) -> tuple[Path, Path]:
    """``out/table.md`` and ``out/figure.png`` from every seed folder under ``results``."""
    seeds = read_seeds(results)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "table.md"
    table.write_text("<!-- written by python -m openrlhf_sgrpo.demo.study_report; do not edit -->\n"
                     + report_table(seeds) + "\n")
    return table, plot(seeds, out / "figure.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.demo.study_report", description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True, help="folder of seed folders (e.g. docs/study/seeds)")
    p.add_argument("--out", required=True, help="where table.md and figure.png go (e.g. docs/study)")
    args = p.parse_args(argv)
    try:
        table, figure = write_report(Path(args.results), Path(args.out))
    except SeedFolderError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table.read_text())
    print(f"wrote {table} and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
