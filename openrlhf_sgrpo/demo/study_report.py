"""Regenerate the study's tables and figures from every committed seed folder.

    python -m openrlhf_sgrpo.demo.study_report --results docs/study/seeds --out docs/study

Why regenerate instead of edit: each session adds seed folders (``study_seeds.py``), and the
numbers over seeds are then recomputed from all of them, never typed (DESIGN.md, "Evidence that
accumulates").

Why groups: a CPU seed and a GPU seed differ in kernels, precision and speed, the two regimes
(``--task search`` / ``trap``) ask different questions, and seeds run with other flags (steps,
learning rate...) are other experiments. So seeds are grouped by (device, regime), and within one
by their ``settings`` (every comparison-defining flag; the seed aside); nothing is ever pooled
across groups. Per group, ``OUT/table.md`` has a section: the settings; the arms' held-out table
after RL (mean ± sample std [95 % t-interval] over seeds, the warm-up row first); the **paired**
differences arm - GRPO per seed (the arms of a seed start from the same warm-up weights, so the
seed's own difficulty cancels); where the seeds ended (how many ended at two searches, with the exact
interval of that count, and the sign of each seed's paired two-hop EM difference: the trap seeds'
outcomes are nearly binary, which a mean and t-interval over a few seeds hide); the strata after
the warm-up (each search count's share and EM, sampled on held-out two-hop questions: whether the
trap was there); whether GRPO's search count
has settled (the last steps' curve and its slope); seconds per step per session. And a figure,
``OUT/figure_<regime>_<device>[_<k>].png``: training reward, searches per question, two-search
share on two-hop prompts, the net advantage mass of the 1- and 2-search strata, and their mean
training reward (mean ± std over seeds per arm).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from openrlhf_sgrpo.demo.study_seeds import SCHEMA, SETTINGS, device_tag
from openrlhf_sgrpo.demo.trap_paths import PATH_PREFIX, PATHS, path_cell, windows
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
BASELINE = "GRPO"  # the arm every other arm's paired difference is taken against
# (held-out key, column) of the paired differences arm - GRPO
PAIRED = (("hop2/em", "EM 2-hop"), ("search_calls", "searches/q"), ("hop2/two_search_share", "two-search share 2-hop"),
          ("hop1/em", "EM 1-hop"))
STRATA = ("0", "1", "2", "3plus")  # demo/strata_check.py's names
SETTLE_STEPS = 5  # the last steps over which "has the search count settled" is judged
SETTLE_KEY = "search_calls"
# held-out two-search share on two-hop questions at or above which a seed "ended at two searches":
# the trap seeds end near 0 or near 1 (bimodal), so a count with an exact interval says more than a mean
TWO_SEARCH_END = 0.5
# (step key, panel title) of the figure's curves
CURVES = (("reward", "training reward"), ("search_calls", "searches per question"),
          ("hop2/two_search_share", "two-search share, two-hop prompts"))
FONT_PT = 8  # the smallest font of the figure: legible at GitHub's ~880 px (the figure is 880 px wide)
FIG_WIDTH_IN, FIG_DPI = 8.8, 100


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


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def stats(values: list[float]) -> dict:
    """n, mean, sample std (n - 1) and the 95 % t-interval of the mean; std and interval are NaN
    for one value (one seed says nothing about the spread)."""
    values = _finite(values)
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": math.nan, "std": math.nan, "lo": math.nan, "hi": math.nan}
    mean = statistics.fmean(values)
    if n == 1:
        return {"n": 1, "mean": mean, "std": math.nan, "lo": math.nan, "hi": math.nan}
    std = statistics.stdev(values)
    half = t975(n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "lo": mean - half, "hi": mean + half}


# ---------------------------------------------------------------------------------------- reading


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
        found = meta.get("schema") if isinstance(meta, dict) else None
        old = (" (schema 1 has no regime or settings, so its table cannot be known; export it again from its "
               "run folder with study_seeds.export_seed)") if found == 1 else ""
        raise SeedFolderError(f"seed folder {folder}: seed.json has schema {found!r}, expected {SCHEMA}{old}")
    for key in ("session", "device", "seed", "arms", "regime", "settings"):
        if key not in meta:
            raise SeedFolderError(f"seed folder {folder}: seed.json lacks {key!r}")
    if not isinstance(meta["arms"], dict) or not meta["arms"]:
        raise SeedFolderError(f"seed folder {folder}: seed.json's 'arms' names no arm")
    if not isinstance(meta["settings"], dict):
        raise SeedFolderError(f"seed folder {folder}: seed.json's 'settings' is not an object")
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


# ---------------------------------------------------------------------------------------- groups


@dataclass
class Group:
    """Seeds that may be pooled: one device, one regime, one set of settings."""

    device: str
    regime: str
    settings: dict
    seeds: list[dict] = field(default_factory=list)
    index: int | None = None  # 1, 2, ... where the (device, regime) has several settings
    differs: dict[str, list] = field(default_factory=dict)  # setting -> the other sub-groups' values

    @property
    def figure_name(self) -> str:
        regime = device_tag({"device": self.regime})
        suffix = "" if self.index is None else f"_{self.index}"
        return f"figure_{regime}_{device_tag({'device': self.device})}{suffix}.png"

    @property
    def title(self) -> str:
        part = "" if self.index is None else f", settings {self.index}"
        return f"{self.regime} regime, {self.device}{part}: {len(self.seeds)} seed(s)"


def _settings_key(settings: dict) -> str:
    return json.dumps(settings, sort_keys=True)


def group_seeds(seeds: list[dict]) -> list[Group]:
    """Seeds by (regime, device), then by settings (never pooled across); in each (regime, device)
    the sub-groups come in the order of their first folder's name (older sessions first)."""
    by_kind: dict[tuple[str, str], dict[str, Group]] = {}
    for s in sorted(seeds, key=lambda s: s["folder"]):
        subs = by_kind.setdefault((str(s["regime"]), str(s["device"])), {})
        key = _settings_key(s["settings"])
        subs.setdefault(key, Group(str(s["device"]), str(s["regime"]), s["settings"])).seeds.append(s)
    groups = []
    for (_, _), subs in sorted(by_kind.items()):
        members = list(subs.values())
        for i, g in enumerate(members):
            if len(members) > 1:
                g.index = i + 1
                keys = sorted({k for other in members for k in (*other.settings, *g.settings)})
                g.differs = {k: [o.settings.get(k) for o in members if o is not g] for k in keys
                             if any(o.settings.get(k) != g.settings.get(k) for o in members if o is not g)}
            groups.append(g)
    return groups


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings_line(settings: dict) -> str:
    """Every setting in one line, in :data:`study_seeds.SETTINGS` order (others after)."""
    keys = [k for k in SETTINGS if k in settings] + sorted(k for k in settings if k not in SETTINGS)
    return "Settings: " + ", ".join(f"{k} {_fmt(settings[k])}" for k in keys) + "."


def differs_line(group: Group) -> str:
    """Why this group is not pooled with its (device, regime)'s others: the settings that differ."""
    parts = [f"{k} (here {_fmt(group.settings.get(k))}; there {', '.join(_fmt(v) for v in dict.fromkeys(vals))})"
             for k, vals in group.differs.items()]
    return (f"Not pooled with the other {group.regime} / {group.device} table(s): their settings differ in "
            + "; ".join(parts) + ".")


# ---------------------------------------------------------------------------------------- numbers


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


def start_weight_problem(seed: dict) -> str | None:
    """Why a seed's arms may not share their starting weights (digests differ or are missing), or
    None: a paired difference means something only if every arm started from the same weights."""
    digests = {label: arm.get("start_weights") for label, arm in seed["arms"].items()}
    missing = [label for label, d in digests.items() if not d]
    if len(set(d for d in digests.values() if d)) > 1:
        return "its arms' start weights differ (" + ", ".join(f"{a} {d}" for a, d in digests.items()) + ")"
    if missing:
        return "start weights not recorded for " + ", ".join(missing)
    return None


def paired_differences(seeds: list[dict], baseline: str = BASELINE) -> dict[str, dict[str, dict]]:
    """arm -> held-out key -> :func:`stats` of (arm - ``baseline``) over the seeds that ran both
    and logged the key: the seed's own draws (questions, warm-up) are in both arms and cancel."""
    out: dict[str, dict[str, dict]] = {}
    for label in arm_labels(seeds):
        if label == baseline:
            continue
        out[label] = {}
        for key, _ in PAIRED:
            diffs = [d for s in seeds if label in s["arms"] and baseline in s["arms"]
                     and (d := paired_difference(s, label, key, baseline)) is not None]
            out[label][key] = stats(diffs)
    return out


def paired_difference(seed: dict, label: str, key: str, baseline: str = BASELINE) -> float | None:
    """One seed's held-out ``key`` of arm ``label`` minus ``baseline``'s, None where either is not logged."""
    a, b = _value(seed, label, ("heldout", key)), _value(seed, baseline, ("heldout", key))
    return float(a) - float(b) if _finite([a]) and _finite([b]) else None


def strata_summary(seeds: list[dict]) -> dict[str, dict]:
    """stratum -> ``share`` and ``em``: :func:`stats` over the seeds with a strata check (a stratum
    a seed's check did not see has share 0 and no EM there), and the pooled trajectories ``n``,
    successes ``wins`` and ``em`` (wins / n). Strata no seed saw are left out."""
    checks = [s["strata_warmup"] for s in seeds if isinstance(s.get("strata_warmup"), dict)]
    out: dict[str, dict] = {}
    for name in STRATA:
        rows = [(c.get("strata") or {}).get(name) for c in checks]
        if not any(rows):
            continue
        n = sum(int(r["n"]) for r in rows if r)
        wins = sum(round(float(r["em"]) * int(r["n"])) for r in rows if r)
        out[name] = {"share": stats([float(r["share"]) if r else 0.0 for r in rows]),
                     "em": stats([r["em"] for r in rows if r]), "n": n, "wins": wins,
                     "em_pooled": wins / n if n else math.nan}
    return out


def ls_slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys on xs (numpy.polyfit's degree-1 coefficient)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def settled(seeds: list[dict], key: str = SETTLE_KEY, window: int = SETTLE_STEPS) -> dict[str, dict]:
    """arm -> the training ``key`` at each of the last ``window`` steps (``last``: the mean over
    seeds at each position, the last step last), ``slope``: :func:`stats` of each seed's
    least-squares slope over those steps (per step), ``steps``: the seeds' step numbers, ``short``:
    folders with fewer steps (left out). A slope whose interval holds 0 is a curve that has
    stopped moving, as far as these seeds can tell."""
    out: dict[str, dict] = {}
    for label in arm_labels(seeds):
        tails, short = [], []
        for s in seeds:
            if label not in s["arms"]:
                continue
            rows = [r for r in s["steps"].get(label, []) if _finite([r.get(key)])]
            if len(rows) < window:
                short.append(s["folder"])
                continue
            tails.append(rows[-window:])
        last = [statistics.fmean(float(t[i][key]) for t in tails) if tails else math.nan for i in range(window)]
        slopes = [ls_slope([float(r["step"]) for r in t], [float(r[key]) for r in t]) for t in tails]
        out[label] = {"last": last, "slope": stats(slopes), "short": short,
                      "steps": sorted({tuple(r["step"] for r in t) for t in tails})}
    return out


def step_times(seeds: list[dict]) -> dict[tuple[str, str], dict[str, dict]]:
    """(session, device) -> arm -> stats of each seed's mean seconds per training step."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for s in seeds:
        for label, rows in s["steps"].items():
            walls = [r["wall_s"] for r in rows if r.get("wall_s") is not None]
            if walls:
                out.setdefault((s["session"], s["device"]), {}).setdefault(label, []).append(statistics.fmean(walls))
    return {k: {label: stats(v) for label, v in arms.items()} for k, arms in out.items()}


# ---------------------------------------------------------------------------------------- text


def _cell(s: dict, digits: int = 3) -> str:
    if s["n"] == 0:
        return "-"
    if s["n"] == 1:
        return f"{s['mean']:.{digits}f}"
    d = digits
    return f"{s['mean']:.{d}f} ± {s['std']:.{d}f} [{s['lo']:.{d}f}, {s['hi']:.{d}f}]"


def arms_table(seeds: list[dict]) -> str:
    """The held-out table: the warm-up row (where every arm starts), then each arm after RL."""
    summary = summarize(seeds)
    warm = {col: stats([(s.get("after_warmup") or {}).get(src[1]) for s in seeds]) if src[0] == "heldout" else None
            for col, src in COLUMNS}
    rows = [["after warm-up (start)", max(c["n"] for c in warm.values() if c), *(_cell(c) if c else "-"
                                                                                for c in warm.values())]]
    rows += [[label, max(c["n"] for c in cols.values()), *(_cell(cols[c]) for c, _ in COLUMNS)]
             for label, cols in summary.items()]
    return format_table(["arm (held-out after RL)", "seeds", *(c for c, _ in COLUMNS)], rows)


def processor_kind(seed: dict) -> str:
    """The seed's processor as its widest vector unit (AMX, AVX-512 BF16, AVX-512, AVX2) for a CPU
    seed, the device itself otherwise. Why: the CPU's kernels differ by instruction set, so a seed
    repeats itself only on one kind, and a reader of a few seeds should see which kind each was."""
    if seed.get("device") != "cpu":
        return str(seed.get("device") or "?")
    isa = set(str((seed.get("environment") or {}).get("cpu_isa") or "").split())
    for flag, name in (("amx_tile", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2")):
        if flag in isa:
            return name
    return "?"


def per_seed_differences(seeds: list[dict], baseline: str = BASELINE) -> list[list]:
    """One row per (seed, arm other than ``baseline``): the paired differences of that seed alone,
    so that a few seeds can be read one by one, with the processor each ran on."""
    rows = []
    for s in seeds:
        if baseline not in s["arms"]:
            continue
        for label in s["arms"]:
            if label == baseline:
                continue
            cells = ["-" if (d := paired_difference(s, label, key, baseline)) is None else f"{d:+.3f}"
                     for key, _ in PAIRED]
            rows.append([s["folder"], processor_kind(s), f"{label} - {baseline}", *cells])
    return rows


def paired_section(seeds: list[dict]) -> list[str]:
    """The paired differences' table, and a line per seed whose arms' start weights are in doubt."""
    diffs = paired_differences(seeds)
    if not diffs or all(BASELINE not in s["arms"] for s in seeds):
        return [f"Paired differences: no {BASELINE} arm and another in the same seed."]
    rows = []
    for label, by_key in diffs.items():
        n = max(st["n"] for st in by_key.values())
        rows.append([f"{label} - {BASELINE}", n, *(_cell(by_key[k]) + ("" if by_key[k]["n"] in (0, n) else
                                                                         f" (n {by_key[k]['n']})") for k, _ in PAIRED)])
    flags = [f"- flagged: seed {s['seed']} ({s['folder']}): {p}; its differences are in the table, but not from "
             "one verified start" for s in seeds if (p := start_weight_problem(s))]
    return [f"Paired differences on held-out after RL, per seed arm minus {BASELINE} (every arm of a seed starts "
            "from the same warm-up weights, start_weights); over seeds: mean ± sample std [95 % t-interval]:", "",
            format_table(["arm - GRPO (held-out)", "seeds", *(c for _, c in PAIRED)], rows),
            *([""] + flags if flags else []), "", "Each seed's paired differences:", "",
            format_table(["seed folder", "processor", "arm - GRPO", *(c for _, c in PAIRED)],
                         per_seed_differences(seeds))]


def binomial_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact) interval of a proportion from ``k`` of ``n``: the p whose binomial
    tail at k is (1 - level) / 2 on each side, found by bisection (no scipy needed)."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k {k}, n {n}")
    tail = (1.0 - level) / 2

    def at_most(j: int, p: float) -> float:  # P(X <= j | p), decreasing in p
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(j + 1))

    def solve(f, target: float) -> float:  # the p in [0, 1] where the decreasing f crosses target
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: at_most(k - 1, p), 1.0 - tail)  # P(X >= k) = tail
    upper = 1.0 if k == n else solve(lambda p: at_most(k, p), tail)  # P(X <= k) = tail
    return lower, upper


def outcomes(seeds: list[dict], baseline: str = BASELINE) -> dict[str, dict]:
    """Per arm, over the seeds that measured it: how many ended at two searches on held-out two-hop
    questions (``TWO_SEARCH_END``) with its exact interval, and, against ``baseline`` in the same
    seed, in how many its held-out two-hop EM was higher, equal, lower."""
    out: dict[str, dict] = {}
    for label in arm_labels(seeds):
        shares = _finite(_value(s, label, ("heldout", "hop2/two_search_share")) for s in seeds if label in s["arms"])
        if not shares:
            continue
        two = sum(v >= TWO_SEARCH_END for v in shares)
        row = {"n": len(shares), "two": two, "interval": binomial_interval(two, len(shares))}
        if label != baseline:
            diffs = _finite(paired_difference(s, label, "hop2/em", baseline) for s in seeds)
            row["em2"] = (sum(d > 1e-9 for d in diffs), sum(abs(d) <= 1e-9 for d in diffs), sum(d < -1e-9 for d in diffs))
        out[label] = row
    return out


def outcomes_section(seeds: list[dict]) -> list[str]:
    """Which way each seed went, counted: the arms' two-search endings and the sign of each seed's
    paired two-hop EM difference."""
    rows = [[label, f"{o['two']} of {o['n']}", f"[{o['interval'][0]:.2f}, {o['interval'][1]:.2f}]",
             "-" if "em2" not in o else "{} / {} / {}".format(*o["em2"])] for label, o in outcomes(seeds).items()]
    if not rows:
        return []
    return [f"Where the seeds ended (held-out after RL, two-hop questions): seeds whose two-search share is >= "
            f"{TWO_SEARCH_END} (95 % Clopper-Pearson interval of the proportion), and the paired two-hop EM "
            f"against {BASELINE} seed by seed:", "",
            format_table(["arm", "ended at two searches", "95 % interval", f"EM 2-hop vs {BASELINE}: higher / equal / lower"],
                         rows)]


def strata_section(seeds: list[dict]) -> list[str]:
    """The strata after the warm-up: over seeds and pooled, then each seed's own."""
    summary = strata_summary(seeds)
    checked = [s for s in seeds if isinstance(s.get("strata_warmup"), dict)]
    if not summary:
        return ["Strata after the warm-up: no seed made a strata check (--strata-check 0)."]
    rows = [[f"{name} search{'es' if name != '1' else ''}", v["share"]["n"], _cell(v["share"]), _cell(v["em"]),
             v["n"], f"{v['em_pooled']:.3f} ({v['wins']}/{v['n']})"] for name, v in summary.items()]
    per_seed = []
    for s in checked:
        check = s["strata_warmup"]
        found = check.get("strata") or {}
        cells = [f"{found[k]['em']:.2f} (n {found[k]['n']})" if k in found else "-" for k in summary]
        drawn = f"{check.get('questions', '?')} x {check.get('samples_per_question', '?')}"
        per_seed.append([s["folder"], drawn, *cells])
    trapped = [s["folder"] for s in checked if in_the_trap(s["strata_warmup"])]
    trap_line = ([f"Started in the trap (two searches' EM below one search's after the warm-up, the regime's "
                  f"premise): {len(trapped)} of {len(checked)} seed(s)"
                  + (f"; not: {', '.join(s['folder'] for s in checked if s['folder'] not in trapped)}"
                     if len(trapped) < len(checked) else "") + ".", ""]
                 if any(s.get("regime") == "trap" for s in checked) else [])
    return [f"Strata after the warm-up (sampled trajectories on held-out two-hop questions, by search count; "
            f"{len(checked)} of {len(seeds)} seed(s) made the check). Share and EM: mean over seeds ± std "
            "[95 % t-interval] (EM over the seeds whose check saw the stratum); pooled: all seeds' trajectories:", "",
            format_table(["stratum", "seeds", "share", "EM", "pooled n", "pooled EM"], rows), "", *trap_line,
            "Each seed's strata (EM, trajectories):", "",
            format_table(["seed folder", "questions x samples", *(r[0] for r in rows)], per_seed)]


def in_the_trap(check: dict) -> bool:
    """Whether a strata check saw the trap regime's premise: the two-search stratum's EM below the
    one-search one's (both strata sampled)."""
    found = check.get("strata") or {}
    return "1" in found and "2" in found and found["2"]["em"] < found["1"]["em"]


def settled_section(seeds: list[dict]) -> list[str]:
    """Whether the search count has stopped moving: the last steps and the slope over them."""
    result = settled(seeds)
    heads = ["arm", "seeds", *(f"step last-{SETTLE_STEPS - 1 - i}" if i < SETTLE_STEPS - 1 else "last step"
                               for i in range(SETTLE_STEPS)), "slope per step"]
    rows = [[label, r["slope"]["n"], *(f"{v:.3f}" if not math.isnan(v) else "-" for v in r["last"]),
             _cell(r["slope"], 4)] for label, r in result.items()]
    spans = sorted({f"{t[0]}-{t[-1]}" for r in result.values() for t in r["steps"]})
    short = sorted({f for r in result.values() for f in r["short"]})
    return [f"Has the search count settled? Training {SETTLE_KEY} (searches per question) at each seed's last "
            f"{SETTLE_STEPS} steps (steps {', '.join(spans) or '-'}), mean over seeds, and each seed's least-squares "
            f"slope over them (searches per question per step): mean ± std [95 % t-interval]; an interval around 0 "
            "is a flat curve:", "", format_table(heads, rows),
            *(["", f"(left out: fewer than {SETTLE_STEPS} steps: {', '.join(short)})"] if short else [])]


def times_section(seeds: list[dict]) -> list[str]:
    """Seconds per training step per session (they compare only within a session)."""
    times = step_times(seeds)
    trows = [[session, device, label, s["n"], _cell(s)] for (session, device), arms in sorted(times.items())
             for label, s in arms.items()]
    return ["Seconds per training step (each seed's mean; compare arms within a session only):", "",
            format_table(["session", "device", "arm", "seeds", "s/step"], trows) if trows else "(no step times)"]


PATH_WINDOW = 4  # steps per row of the paths table


def _window_paths(rows: list[dict], steps: range) -> dict[str, tuple[float, float]] | None:
    """slug -> (mean share, share-weighted EM sum) over a seed's steps in ``steps`` (every step of
    the trap world trains on the same number of two-hop trajectories, so share weights are counts),
    or None where those steps logged no path."""
    picked = [r for r in rows if r["step"] in steps and any(k.startswith(PATH_PREFIX) for k in r)]
    if not picked:
        return None
    out = {}
    for slug, _ in PATHS:
        shares = [float(r.get(f"{PATH_PREFIX}{slug}/share") or 0.0) for r in picked]
        wins = [float(r.get(f"{PATH_PREFIX}{slug}/share") or 0.0) * float(r.get(f"{PATH_PREFIX}{slug}/em") or 0.0)
                for r in picked]
        out[slug] = (sum(shares) / len(picked), sum(wins) / len(picked))
    return out


def paths_section(seeds: list[dict]) -> list[str]:
    """The trap world's paths per arm (demo/trap_paths.py): the two-hop training trajectories in
    windows of :data:`PATH_WINDOW` steps and the held-out two-hop questions after RL; [] where no
    seed has them."""
    if not any(k.startswith(PATH_PREFIX) for s in seeds for rows in s["steps"].values() for r in rows for k in r):
        return []
    lines = []
    for label in arm_labels(seeds):
        last = max((r["step"] for s in seeds for r in s["steps"].get(label) or []), default=0)
        for name, steps in windows(last, PATH_WINDOW):
            per_seed = [w for s in seeds if (w := _window_paths(s["steps"].get(label) or [], steps))]
            if not per_seed:
                continue
            cells = []
            for slug, _ in PATHS:
                shares = sum(w[slug][0] for w in per_seed)
                cells.append(path_cell(shares / len(per_seed), sum(w[slug][1] for w in per_seed) / shares)
                             if shares else "-")
            lines.append([label, f"steps {name}", len(per_seed), *cells])
        held = [h for s in seeds if (h := (s["arms"].get(label) or {}).get("heldout_paths"))]
        if held:
            total = sum(c["n"] for h in held for c in h.values())
            cells = []
            for slug, _ in PATHS:
                n = sum(h[slug]["n"] for h in held if slug in h)
                wins = sum(h[slug]["n"] * h[slug]["em"] for h in held if slug in h)
                cells.append(path_cell(n / total, wins / n) if n else "-")
            lines.append([label, "held-out after RL", len(held), *cells])
    return ["Paths on two-hop questions (trap world; demo/trap_paths.py, from the rollout records): per path its "
            "share of the trajectories, mean over seeds, and (its EM, pooled); 2 = two searches, by the second "
            "query: the birth town (right bridge), the work town (wrong bridge) or anything else:", "",
            format_table(["arm", "when", "seeds", *(name for _, name in PATHS)], lines)]


def group_section(group: Group) -> str:
    """One group's markdown section: heading, settings, and every table of it, its figure."""
    seeds = group.seeds
    sessions = sorted({s["session"] for s in seeds})
    by_seed: dict[int, list[str]] = {}
    for s in seeds:
        by_seed.setdefault(s["seed"], []).append(s["folder"])
    # a seed run twice shares its warm-up data and draws: not two independent samples
    repeats = [f"note: seed {k} is in {len(f)} folders ({', '.join(f)}): repeated seeds are not independent draws; "
               "give a session new seeds" for k, f in sorted(by_seed.items()) if len(f) > 1]
    arm_flags = [f"note: {s['folder']}: arm {label} ran with other settings: "
                 + ", ".join(f"{k} {_fmt(v)}" for k, v in arm["settings_differ"].items())
                 for s in seeds for label, arm in s["arms"].items() if arm.get("settings_differ")]
    text = [f"## {group.title}", "", settings_line(group.settings),
            *([differs_line(group)] if group.differs else []), "",
            f"{len(seeds)} seed folder(s) from {len(sessions)} session(s): {', '.join(sessions)}. "
            f"Seeds: {', '.join(str(s['seed']) for s in seeds)}.",
            "Cells: mean over seeds ± sample std [95 % t-interval of the mean]; one seed: the value alone.",
            *repeats, *arm_flags, "", arms_table(seeds), "", *paired_section(seeds), "",
            *((ends + [""]) if (ends := outcomes_section(seeds)) else []), *strata_section(seeds), "",
            *((paths + [""]) if (paths := paths_section(seeds)) else []),
            *settled_section(seeds), "", *times_section(seeds), "", f"![{group.title}]({group.figure_name})"]
    return "\n".join(text)


def report_table(seeds: list[dict], groups: list[Group] | None = None) -> str:
    """The markdown the report writes: a list of the groups and their figures, then one section
    per group (nothing pooled across them)."""
    groups = groups if groups is not None else group_seeds(seeds)
    index = [f"- {g.title}: `{g.figure_name}`" for g in groups]
    head = [f"{len(seeds)} seed folder(s) in {len(groups)} table(s): one per regime, device and settings, never "
            "pooled across. Figures:", *index]
    return "\n\n".join(["\n".join(head), *(group_section(g) for g in groups)])


# ---------------------------------------------------------------------------------------- figure


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


def _draw(ax, seeds: list[dict], label: str, key: str, color: str, style: str = "-", alpha: float = 0.15) -> bool:
    """One arm's mean curve of ``key`` with a ± one std band; False where no seed logged it."""
    steps, means, stds = _band(seeds, label, key)
    if not steps:
        return False
    ax.plot(steps, means, style, color=color, lw=1.4)
    ax.fill_between(steps, [m - d for m, d in zip(means, stds)], [m + d for m, d in zip(means, stds)],
                    color=color, alpha=alpha, lw=0)
    return True


def plot(seeds: list[dict], path: Path, title: str | None = None) -> Path:
    """Figure 1 of the paper, our way, for one group: three training curves, the mechanism (the net
    advantage mass of the 1- and 2-search strata) and those strata's mean reward; 880 px wide, so
    GitHub shows it unscaled and its >= 8 pt fonts stay legible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    labels = arm_labels(seeds)
    colors = {label: f"C{i}" for i, label in enumerate(labels)}
    with plt.rc_context({"font.size": FONT_PT, "axes.titlesize": FONT_PT + 1, "axes.labelsize": FONT_PT,
                         "xtick.labelsize": FONT_PT, "ytick.labelsize": FONT_PT, "legend.fontsize": FONT_PT}):
        fig, grid = plt.subplots(2, 3, figsize=(FIG_WIDTH_IN, 6.2))
        axes = list(grid.flat)
        for ax, (key, name) in zip(axes, CURVES):
            for label in labels:
                _draw(ax, seeds, label, key, colors[label])
            ax.set_title(name)
        for ax, key, name in ((axes[3], "adv_mass", "net advantage mass"), (axes[4], "reward", "mean reward")):
            drawn = False
            for label in labels:
                for k, style in ((1, "-"), (2, "--")):
                    drawn |= _draw(ax, seeds, label, f"sgrpo/stratum{k}/{key}", colors[label], style, alpha=0.08)
            ax.set_title(f"{name} by stratum\n1 search solid, 2 dashed")
            if not drawn:
                ax.text(0.5, 0.5, f"no sgrpo/stratum{{k}}/{key}\nin these seeds", ha="center", va="center",
                        transform=ax.transAxes)
            elif key == "adv_mass":
                ax.axhline(0.0, color="grey", lw=0.6)
        for ax in axes[:5]:
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        legend = axes[5]
        legend.axis("off")
        handles = [Line2D([], [], color=colors[label], lw=2) for label in labels]
        handles += [Line2D([], [], color="black", ls="-"), Line2D([], [], color="black", ls="--")]
        legend.legend(handles, [*labels, "1-search stratum", "2-search stratum"], loc="center", frameon=False,
                      title="mean ± std over seeds")
        fig.suptitle(f"{title or f'{len(seeds)} seed(s)'}: training curves", fontsize=FONT_PT + 2)
        fig.tight_layout()
        fig.savefig(path, dpi=FIG_DPI)
        plt.close(fig)
    return path


def write_report(results: Path, out: Path) -> tuple[Path, Path]:
    """``out/table.md`` and one ``out/figure_<regime>_<device>[_<k>].png`` per group from every
    seed folder under ``results``; returns (table, the first group's figure)."""
    table, figures = write_report_all(results, out)
    return table, figures[0]


def write_report_all(results: Path, out: Path) -> tuple[Path, list[Path]]:
    """:func:`write_report`, returning every figure. Figures of groups that no longer exist are
    not deleted (the folder may hold others' files): they are named on stderr."""
    seeds = read_seeds(results)
    groups = group_seeds(seeds)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = [plot(g.seeds, out / g.figure_name, g.title) for g in groups]
    written = {f.name for f in figures}
    stale = sorted(p.name for p in out.glob("figure_*.png") if p.name not in written)
    table = out / "table.md"
    table.write_text("<!-- written by python -m openrlhf_sgrpo.demo.study_report; do not edit -->\n"
                     + report_table(seeds, groups) + "\n")
    if stale:
        print(f"note: {out} also holds {', '.join(stale)}, not written by this report (a group that is gone?)",
              file=sys.stderr)
    return table, figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.demo.study_report", description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True, help="folder of seed folders (e.g. docs/study/seeds)")
    p.add_argument("--out", required=True, help="where table.md and the figures go (e.g. docs/study)")
    args = p.parse_args(argv)
    try:
        table, figures = write_report_all(Path(args.results), Path(args.out))
    except SeedFolderError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table.read_text())
    print(f"wrote {table} and {', '.join(str(f) for f in figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
