"""One seed of the study as small data files: what gets committed, so sessions add up.

A demo run's folder holds checkpoints, rollout records and predictions (megabytes); the study's
evidence is much less: per arm, per step, the training curves and the mechanism keys, and the
held-out table after RL, plus where the numbers come from (device, versions, commit, argv). A
seed folder (``<session>_<device>_seed<k>/``) holds exactly that in two files:

- ``seed.json``: ``schema``, ``session``, ``device``, ``seed``, ``commit``, ``argv``,
  ``environment``, ``regime`` (the demo's ``--task``: ``search`` or ``trap``), ``settings`` (the
  demo flags that define the comparison, :data:`SETTINGS`, typed back from the run's
  ``args.json``), ``after_warmup`` (held-out), ``strata_warmup`` (the sampled strata check after
  the warm-up: ``strata``, ``questions``, ``samples_per_question``; null where the run made none)
  and ``arms``: label -> ``{dir, estimator, alpha, stratify_by, start_weights, heldout, steps}``
  (held-out after RL; ``settings_differ`` where an arm's own run folder had other settings);
- ``steps.jsonl``: one line per (arm, step): ``arm``, ``step``, ``wall_s`` (seconds since the
  previous step, or since the arm started) and the :data:`STEP_KEYS` and ``sgrpo/stratum*`` keys
  the step logged; in the trap world, from the arm's rollout records, the two-hop trajectories'
  paths (``path/<slug>/share`` and ``/em``, :mod:`.trap_paths`), with ``heldout_paths`` per arm
  in ``seed.json``.

``study_report.py`` reads every such folder; nothing is regenerated from the big run folders.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

from openrlhf_sgrpo.local.step_log import read_step_log

SCHEMA = 2  # 2: regime, settings and strata_warmup (1 had none of them; the report refuses it)
# held-out keys kept per arm (demo/hops.py's names)
HELDOUT_KEYS = ("em", "f1", "hop1/em", "hop2/em", "hop2/f1", "search_calls", "hop1/search_calls",
                "hop2/search_calls", "hop2/two_search_share", "answered", "n")
# per-step training keys kept (the mechanism's sgrpo/stratum{k}/* keys are kept too, whatever k)
# (a seed of 3 arms x 20 steps stays < 50 KB: the strata a step did not have are left out, values
# keep 4 decimals; tests/test_study_report.py checks the size)
STEP_KEYS = ("reward", "em", "search_calls", "answered", "hop1/em", "hop2/em", "hop1/search_calls",
             "hop2/search_calls", "hop2/two_search_share", "sgrpo/strata_per_prompt", "time/update_s")
STRATUM_KEY = re.compile(r"^sgrpo/stratum(\d+(?:plus)?)/")  # stratum0 .. stratum4plus (mechanism.py)


# the demo flags (args.json's keys) that define a comparison, each with the type args.json's string
# is read back as: seeds whose settings differ are never pooled (study_report.py)
SETTINGS: dict[str, type] = {
    "task": str, "model": str, "engine": str, "steps": int, "prompts_per_step": int, "n_samples": int,
    "micro_batch_size": int, "train_batch_size": int, "max_epochs": int, "lr": float, "reward": str,
    "temperature": float, "warmup_steps": int, "warmup_lr": float, "demos": int, "train_pairs": int,
    "heldout": int, "task_seed": int, "max_turns": int, "max_len": int, "max_tokens_per_turn": int,
    "max_obs_tokens": int, "kl_coef": float, "sapo": bool, "calibadv": bool, "shared_prefix": bool,
    "gradient_checkpointing": bool, "strata_check": int, "warmup_batch": int, "fresh_rl_questions": bool,
    "skip_zero_advantage": bool,
}
DEFAULT_REGIME = "search"  # run folders from before --task have no "task": the search-necessary task
STRATA_KEYS = ("strata", "questions", "samples_per_question")  # kept of the strata_check record


class SeedExportError(ValueError):
    """A run folder that cannot become a seed folder; the message names the folder."""


def _typed(folder: Path, key: str, text, kind: type):
    """One args.json value (the demo writes ``str(value)``) as ``kind``; None stays None."""
    if text is None or text == "None":
        return None
    try:
        if kind is bool:
            if str(text) not in ("True", "False"):
                raise ValueError(text)
            return str(text) == "True"
        return kind(text)
    except ValueError:
        article = "an" if kind is int else "a"
        raise SeedExportError(f"run folder {folder}: args.json's {key!r} is {text!r}, "
                              f"not {article} {kind.__name__}") from None


def read_args(folder: Path) -> dict:
    """The run's ``args.json`` (every demo flag as a string); a missing or unreadable one is an
    error naming the folder: without it a seed's settings, hence its table, are unknown."""
    path = Path(folder) / "args.json"
    try:
        args = json.loads(path.read_text())
    except FileNotFoundError:
        raise SeedExportError(f"run folder {folder}: args.json is missing (the demo writes it first)") from None
    except ValueError as err:
        raise SeedExportError(f"run folder {folder}: args.json is not JSON ({err})") from None
    if not isinstance(args, dict):
        raise SeedExportError(f"run folder {folder}: args.json is not an object")
    return args


def run_settings(folder: Path, args: dict) -> dict:
    """:data:`SETTINGS` typed back from ``args``; a flag the run's demo did not have yet is None
    (``task``: :data:`DEFAULT_REGIME`), so such a seed lands in a table of its own."""
    settings = {key: _typed(folder, key, args.get(key), kind) for key, kind in SETTINGS.items()}
    if settings["task"] is None:
        settings["task"] = DEFAULT_REGIME
    return settings


def _strata_warmup(records: list[dict]) -> dict | None:
    """The last ``strata_check`` record's strata, questions and samples per question, or None."""
    check = _last(records, "strata_check")
    if check is None or not isinstance(check.get("strata"), dict):
        return None
    out = {k: check[k] for k in STRATA_KEYS if k in check}
    out["strata"] = {s: {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
                     for s, row in check["strata"].items()}
    return out


def _last(records: list[dict], phase: str) -> dict | None:
    rows = [r for r in records if r.get("phase") == phase]
    return rows[-1] if rows else None


def _train_steps(records: list[dict]) -> list[dict]:
    """Train records by step, the last of each (a resumed run redoes the steps after its
    checkpoint), each with ``wall_s``: seconds since the step before it or the arm's start."""
    by_step: dict[int, dict] = {}
    for r in records:
        if r.get("phase") == "train":
            by_step[int(r["step"])] = r
    start = _last(records, "arm_start")
    steps, prev = [], (start or {}).get("time")
    for k in sorted(by_step):
        r = dict(by_step[k])
        r["wall_s"] = (r["time"] - prev) if prev is not None and r.get("time") is not None else None
        prev = r.get("time")
        steps.append(r)
    return steps


def load_seed_run(folder: Path, arms: str, arm_runs: list[Path] | None = None) -> dict:
    """A finished (or cut-off) demo run of ``--arms arms`` read back from its folder, in the form
    ``demo.__main__.run`` returns (``after_warmup``, ``arms``: label -> held-out after RL or None,
    ``steps``: label -> train records); ``arm_runs``: each arm's run folder where the arms ran as
    processes of their own (``study_runner``'s split_arms; the first is ``folder``)."""
    from openrlhf_sgrpo.demo.arms import arms_for

    folder = Path(folder)
    run_records = read_step_log(folder / "metrics.jsonl")
    warm = _last(run_records, "eval_warmup")
    settings = run_settings(folder, read_args(folder))
    result: dict = {"after_warmup": warm, "strata_warmup": _strata_warmup(run_records), "settings": settings,
                    "arms": {}, "steps": {}, "arm_meta": {}, "arm_dirs": {}}
    for i, arm in enumerate(arms_for(argparse.Namespace(out=folder, arms=arms))):
        arm_dir = (Path(arm_runs[i]) / arm.dir.name) if arm_runs else arm.dir
        records = read_step_log(arm_dir / "metrics.jsonl")
        result["arms"][arm.label] = _last(records, "eval_after")
        result["steps"][arm.label] = _train_steps(records)
        result["arm_dirs"][arm.label] = arm_dir
        start = _last(records, "arm_start") or {}
        result["arm_meta"][arm.label] = {"dir": arm.dir.name, "estimator": arm.estimator, "alpha": arm.alpha,
                                         "stratify_by": arm.stratify_by, "start_weights": start.get("weights")}
        if arm_runs and Path(arm_runs[i]) != folder:  # its own process: were its flags the seed's?
            own = run_settings(Path(arm_runs[i]), read_args(Path(arm_runs[i])))
            differ = {k: v for k, v in own.items() if v != settings[k]}
            if differ:
                result["arm_meta"][arm.label]["settings_differ"] = differ
    return result


def trap_paths(run: dict) -> dict[str, tuple[dict[int, dict], dict | None]]:
    """label -> (step -> the step's ``path/*`` fields, held-out path counts after RL) for a run of
    the trap world with rollout records (:mod:`.trap_paths`); {} for another world."""
    settings = run["settings"]
    if settings.get("task") != "trap" or any(settings.get(k) is None for k in ("train_pairs", "heldout", "task_seed")):
        return {}
    from openrlhf_sgrpo.demo.trap_paths import arm_heldout_paths, arm_step_paths, step_fields, task_questions

    questions = task_questions(settings)
    out = {}
    for label, arm_dir in run["arm_dirs"].items():
        held = arm_heldout_paths(arm_dir, questions)
        out[label] = ({step: step_fields(c) for step, c in arm_step_paths(arm_dir, questions).items()},
                      {slug: {"n": int(n), "em": w / n} for slug, (n, w) in held.items() if n} if held else None)
    return out


def _pick(record: dict | None, keys) -> dict | None:
    if record is None:
        return None
    return {k: record[k] for k in keys if k in record}


COMMIT_ENV = "SGRPO_COMMIT"  # the commit, where the tree has no .git (the lent GPU gets a copy)


def git_commit(repo: Path | None = None) -> str:
    """The commit the run's code came from: git's, else ``$SGRPO_COMMIT``, else "unknown"."""
    where = repo or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        out = None
    if out is None or out.returncode != 0:
        return os.environ.get(COMMIT_ENV, "").strip() or "unknown"
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def device_tag(env: dict) -> str:
    """A folder-name-safe device name: ``cpu``, ``nvidia-h200``..."""
    return re.sub(r"[^a-z0-9]+", "-", str(env.get("device", "unknown")).lower()).strip("-") or "unknown"


def export_seed(folder: Path, seed: int, arms: str, dest_root: Path, session: str, argv: list[str],
                commit: str | None = None, arm_runs: list[Path] | None = None) -> Path:
    """Write ``dest_root/<session>_<device>_seed<k>/{seed.json,steps.jsonl}`` from a seed's run
    folder (and its arms' own run folders, ``arm_runs``, where they ran as processes of their own);
    SeedExportError naming the folder where its ``args.json`` is missing or bad."""
    folder = Path(folder)
    env_path = folder / "environment.json"
    env = json.loads(env_path.read_text()) if env_path.exists() else {}
    run = load_seed_run(folder, arms, arm_runs)
    paths = trap_paths(run)
    dest = Path(dest_root) / f"{session}_{device_tag(env)}_seed{seed}"
    dest.mkdir(parents=True, exist_ok=True)
    meta = {
        "schema": SCHEMA, "session": session, "device": env.get("device", "unknown"), "seed": seed,
        "commit": commit or git_commit(), "argv": argv, "environment": env,
        "regime": run["settings"]["task"], "settings": run["settings"],
        "after_warmup": _pick(run["after_warmup"], HELDOUT_KEYS), "strata_warmup": run["strata_warmup"],
        "arms": {label: {**run["arm_meta"][label], "heldout": _pick(after, HELDOUT_KEYS),
                         "steps": len(run["steps"][label]),
                         **({"heldout_paths": paths[label][1]} if label in paths and paths[label][1] else {})}
                 for label, after in run["arms"].items()},
    }
    (dest / "seed.json").write_text(json.dumps(meta, indent=1) + "\n")
    lines = []
    for label, steps in run["steps"].items():
        for r in steps:
            row = {"arm": label, "step": r["step"], "time": r.get("time"), "wall_s": r.get("wall_s")}
            row.update({k: r[k] for k in STEP_KEYS if k in r})
            present = {m.group(1) for k, v in r.items() if (m := STRATUM_KEY.match(k)) and k.endswith("/share") and v}
            row.update({k: v for k, v in r.items() if (m := STRATUM_KEY.match(k)) and m.group(1) in present
                        and isinstance(v, (int, float))})
            row.update(paths[label][0].get(r["step"], {}) if label in paths else {})
            lines.append(json.dumps({k: (round(v, 4) if k != "time" else round(v, 1)) if isinstance(v, float) else v
                                     for k, v in row.items()}, separators=(",", ":")))
    (dest / "steps.jsonl").write_text("\n".join(lines) + ("\n" if lines else ""))
    return dest
