"""The study's seeds side by side: one demo process per seed, several at once on one machine.

Why processes and not threads or one process: each demo run holds its own policy, optimizer,
vLLM engine and retriever; a process is the unit the GPU's memory can be split by (each engine
gets ``--gpu-memory-share`` of the device, ``demo/stack.py``), and the unit that can fail alone
(one seed's crash leaves the others running; its exit status and log path are reported). Each
process is a whole ``python -m openrlhf_sgrpo.demo --arms ...`` run and ``--resume`` is the
demo's own. Two layouts, both with one warm-up per seed and every arm from its weights:

- one process per seed (default): the demo's ``--arms`` trains the arms one after another;
- ``split_arms``: one process per (seed, arm). The first arm's process (``OUT/seed_<s>``) does the
  warm-up and saves its weights (``warmup_policy.pt``, as ``--arms`` always does); each other
  arm's process (``OUT/seed_<s>.<arm dir>``) starts once that file exists, from a copy of it, as
  a ``--resume`` of a run whose warm-up is done. The arms' ``arm_start`` records carry the
  weights' digest, equal across a seed's arms. Three times the processes, a third of the steps
  each: on a lent GPU, where one process's step is launch-bound and the device mostly idle, this
  is what brings 3 seeds x 3 arms x 20 steps inside one call (docs/study.md).

Progress: the runner reads every seed's step logs (``metrics.jsonl``, one record per step with
the wall-clock time the step was logged) as they grow and writes one line per step per process
into ``OUT/progress.log`` (and stdout). The processes' own output goes to ``OUT/logs/seed_<s>.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

from openrlhf_sgrpo.local.stop_signal import SigtermInterrupts

DONE = "study_done.json"  # written in a seed's folder when its process exited 0 (--resume skips it)


def seed_dir(out: Path, seed: int) -> Path:
    return Path(out) / f"seed_{seed}"


def log_path(out: Path, seed: int, arm_dir: str | None = None) -> Path:
    return Path(out) / "logs" / (f"seed_{seed}.log" if arm_dir is None else f"seed_{seed}.{arm_dir}.log")


def arm_run_dir(out: Path, seed: int, index: int, arm_dir: str) -> Path:
    """The run folder of a seed's ``index``-th arm under ``split_arms`` (the first: the seed's own)."""
    return seed_dir(out, seed) if index == 0 else Path(out) / f"seed_{seed}.{arm_dir}"


@dataclass
class SeedJob:
    """One seed's demo process, its log and where the progress reader stands in its step logs."""

    seed: int
    argv: list[str]
    folder: Path
    log: Path
    name: str = ""  # "seed 0", or "seed 0 sgrpo_a0.8" under split_arms
    waits_for: Path | None = None  # the seed's warm-up weights, copied into folder before it starts
    waits_on: "SeedJob | None" = None  # the job that writes them
    proc: subprocess.Popen | None = None
    log_file: IO | None = None
    started: float = 0.0
    rc: int | None = None
    offsets: dict[Path, int] = field(default_factory=dict)  # metrics.jsonl -> bytes read
    last_time: dict[Path, float] = field(default_factory=dict)  # metrics.jsonl -> time of its last record


def demo_argv(seed: int, out: Path, arms: str, demo_args: list[str], resume: bool,
              folder: Path | None = None) -> list[str]:
    """The demo's command line for one seed (``--resume`` where its folder already holds a run)."""
    folder = folder or seed_dir(out, seed)
    argv = [sys.executable, "-m", "openrlhf_sgrpo.demo", *demo_args, "--arms", arms, "--seed", str(seed),
            "--out", str(folder)]
    if resume and folder.exists() and any(folder.iterdir()):
        argv.append("--resume")
    return argv


def arm_items(arms: str) -> list[tuple[str, str]]:
    """``grpo,sgrpo:0.8`` -> [(item, arm folder name), ...] (the names ``demo/arms.py`` gives)."""
    from openrlhf_sgrpo.demo.arms import arms_for

    items = [a.strip() for a in arms.split(",")]
    dirs = [a.dir.name for a in arms_for(argparse.Namespace(out=Path("."), arms=arms))]
    return list(zip(items, dirs))


def seed_runs(out: Path, seed: int, arms: str, split_arms: bool) -> list[Path]:
    """Each arm's run folder, in the arms' order: the seed's own for every arm, or under split_arms
    each arm's (the first: the seed's own)."""
    if not split_arms:
        return [seed_dir(out, seed)] * len(arm_items(arms))
    return [arm_run_dir(out, seed, i, arm_dir) for i, (_, arm_dir) in enumerate(arm_items(arms))]


def seed_finished(out: Path, seed: int, arms: str, split_arms: bool) -> bool:
    """Every process of the seed exited 0 (each left ``study_done.json``)."""
    return all((f / DONE).exists() for f in seed_runs(out, seed, arms, split_arms))


def plan_jobs(seeds: list[int], out: Path, arms: str, demo_args: list[str], resume: bool,
              split_arms: bool) -> list[SeedJob]:
    """The processes of a study, in start order (under split_arms a seed's first arm first)."""
    from openrlhf_sgrpo.demo.__main__ import WARM_WEIGHTS

    out = Path(out)
    jobs = []
    for seed in seeds:
        if not split_arms:
            jobs.append(SeedJob(seed, demo_argv(seed, out, arms, demo_args, resume), seed_dir(out, seed),
                                log_path(out, seed), name=f"seed {seed}"))
            continue
        first = None
        for i, (item, arm_dir) in enumerate(arm_items(arms)):
            folder = arm_run_dir(out, seed, i, arm_dir)
            job = SeedJob(seed, demo_argv(seed, out, item, demo_args, resume or i > 0, folder), folder,
                          log_path(out, seed, arm_dir), name=f"seed {seed} {arm_dir}")
            if i == 0:
                first = job
            else:  # a --resume of a run whose warm-up is done: the demo then trains from the copy
                job.argv += [] if "--resume" in job.argv else ["--resume"]
                job.waits_for, job.waits_on = seed_dir(out, seed) / WARM_WEIGHTS, first
            jobs.append(job)
    return jobs


def _step_line(job: SeedJob, path: Path, rec: dict, t0: float) -> str | None:
    """One progress line for a step-log record (train steps and held-out evaluations), else None."""
    where = path.parent.name if path.parent != job.folder else "run"
    phase, t = rec.get("phase"), rec.get("time") or time.time()
    # a resumed seed's records from before this session: shown (where it was), not as negative T+
    clock = f"T+{t - t0:6.0f} s" if t >= t0 else "(earlier)"
    head = f"[study] {clock} seed {job.seed} {where:<12}"
    fmt = lambda k: "  -  " if not isinstance(rec.get(k), (int, float)) else f"{rec[k]:.3f}"  # noqa: E731
    if phase == "train":
        prev = job.last_time.get(path)
        took = f" ({t - prev:5.1f} s)" if prev is not None else ""
        return (f"{head} step {rec.get('step'):>3}{took} reward {fmt('reward')} searches/2-hop q "
                f"{fmt('hop2/search_calls')} two-search share {fmt('hop2/two_search_share')} hop2 EM {fmt('hop2/em')}")
    if phase and phase.startswith("eval"):
        return f"{head} {phase}: held-out EM 1-hop {fmt('hop1/em')} 2-hop {fmt('hop2/em')}"  # None: NaN in the log
    return None


def read_progress(job: SeedJob, t0: float) -> list[str]:
    """New progress lines from every step log under the seed's folder since the last call."""
    lines = []
    if not job.folder.exists():
        return lines
    for path in sorted(job.folder.glob("**/metrics.jsonl")):
        if "checkpoints" in path.parts:
            continue
        with open(path, "rb") as f:
            f.seek(job.offsets.get(path, 0))
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
        job.offsets[path] = job.offsets.get(path, 0) + len(complete)
        for raw in complete.splitlines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            line = _step_line(job, path, rec, t0)
            if rec.get("time") is not None:
                job.last_time[path] = rec["time"]
            if line:
                lines.append(line)
    return lines


def run_parallel(seeds: list[int], out: Path, arms: str, demo_args: list[str], resume: bool = False,
                 jobs: int | None = None, gpu_share: float | None = None, poll_s: float = 1.0,
                 emit: Callable[[str], None] | None = None, split_arms: bool = False,
                 stagger_s: float = 2.0) -> dict[str, int]:
    """Run the study's demo processes, ``jobs`` at a time (default: all); returns process name
    (``seed 0``, or ``seed 0 grpo`` under ``split_arms``) -> exit status.

    A process whose folder holds ``study_done.json`` is skipped under ``resume`` (exit status 0).
    A failed process is reported with its log and the others go on (under ``split_arms`` a seed's
    other arms are reported not started when its first arm's process ends without warm-up
    weights). Ctrl-C (or ``timeout -s INT`` on the process group, as gpu_vllm_run.sh sends it)
    reaches every demo, which keeps its last checkpoint for ``--resume``; the runner then waits for
    them to finish writing. Starts are ``stagger_s`` apart: engines starting in the same second
    could pick the same free port for their distributed init, and vLLM's start-up check of free
    GPU memory is steadier when the previous engine has finished allocating."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    progress = open(out / "progress.log", "a", encoding="utf-8")
    t0 = time.time()

    def say(line: str) -> None:
        progress.write(line + "\n")
        progress.flush()
        (emit or (lambda s: print(s, flush=True)))(line)

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpu_share is not None:
        demo_args = [*demo_args, "--gpu-memory-share", f"{gpu_share:g}"]
    results: dict[str, int] = {}
    pending: list[SeedJob] = []
    for job in plan_jobs(seeds, out, arms, demo_args, resume, split_arms):
        if resume and (job.folder / DONE).exists():
            say(f"[study] {job.name}: done in an earlier run ({job.folder / DONE}), skipped")
            results[job.name] = job.rc = 0
            continue
        pending.append(job)
    width = max(1, jobs or len(pending) or 1)
    # torch's CPU ops (the retriever's encoder, tokenization) would each start one thread per core
    # in every process: share the cores out instead (unless the caller chose)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // min(width, max(1, len(pending))))))
    running: list[SeedJob] = []
    last_start = 0.0
    say(f"[study] {len(pending)} demo process(es), {width} at a time"
        + (f", each vLLM engine {gpu_share:g} of the GPU's memory" if gpu_share is not None else ""))
    stop = SigtermInterrupts().install()  # kill / a scheduler: the demos wind down as on Ctrl-C
    try:
        while pending or running:
            for job in list(pending):
                if len(running) >= width or time.time() - last_start < stagger_s:
                    break
                if job.waits_for is not None and not job.waits_for.exists():
                    if job.waits_on is not None and job.waits_on.rc is not None:  # ended without them
                        pending.remove(job)
                        results[job.name] = job.rc = -1
                        say(f"[study] {job.name} NOT STARTED: {job.waits_on.name} ended (exit {job.waits_on.rc}) "
                            f"without the warm-up weights {job.waits_for}; log: {job.waits_on.log}")
                    continue
                pending.remove(job)
                _start(job, env, t0, say)
                running.append(job)
                last_start = job.started
            time.sleep(poll_s)
            for job in list(running):
                for line in read_progress(job, t0):
                    say(line)
                rc = job.proc.poll()
                if rc is None:
                    continue
                for line in read_progress(job, t0):  # what it wrote before it exited
                    say(line)
                running.remove(job)
                job.log_file.close()
                job.rc = results[job.name] = rc
                took = time.time() - job.started
                if rc == 0:
                    (job.folder / DONE).write_text(json.dumps({"seed": job.seed, "argv": job.argv, "seconds": took}))
                    say(f"[study] T+{time.time() - t0:6.0f} s {job.name} done in {took:.0f} s")
                else:
                    say(f"[study] T+{time.time() - t0:6.0f} s {job.name} FAILED (exit {rc}) after {took:.0f} s; "
                        f"log: {job.log}")
    except KeyboardInterrupt:
        say("[study] interrupted: waiting for the demo processes to keep their checkpoints (--resume continues)")
        _wind_down(running, forward=stop.received)
        for job in running:
            results[job.name] = job.proc.returncode if job.proc.returncode is not None else -2
        raise
    finally:
        stop.restore()
        progress.close()
    return results


def _start(job: SeedJob, env: dict, t0: float, say: Callable[[str], None]) -> None:
    """Start one demo process (an arm of a split seed from its own copy of the warm-up weights)."""
    if job.waits_for is not None:
        job.folder.mkdir(parents=True, exist_ok=True)
        target = job.folder / job.waits_for.name
        if not target.exists():
            shutil.copyfile(job.waits_for, target.with_suffix(".part"))  # whole, or not there at all
            os.replace(target.with_suffix(".part"), target)
    job.log.parent.mkdir(parents=True, exist_ok=True)
    job.log_file = open(job.log, "a", encoding="utf-8")
    job.log_file.write(f"$ {' '.join(job.argv)}\n")
    job.log_file.flush()
    job.started = time.time()
    job.proc = subprocess.Popen(job.argv, stdout=job.log_file, stderr=subprocess.STDOUT, env=env)
    say(f"[study] T+{job.started - t0:6.0f} s {job.name} started (pid {job.proc.pid}), log {job.log}")


def _wind_down(running: list[SeedJob], grace_s: float = 60.0, forward: bool = False) -> None:
    """Let the demos save and exit; then end the ones still running (SIGTERM: each saves as on
    Ctrl-C). A terminal's Ctrl-C reached them already; ``forward``: the runner alone was sent
    SIGTERM (``kill``, a scheduler), so each demo is sent one now."""
    if forward:
        for job in running:
            if job.proc.poll() is None:
                job.proc.terminate()
    deadline = time.time() + grace_s
    for job in running:
        try:
            job.proc.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            job.proc.terminate()
            try:
                job.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                job.proc.kill()
        if job.log_file:
            job.log_file.close()
