"""Where a test run's CPU went, by module, from the kernel's process accounting (issue #59, item 1).

The suite's own clock (tests/time_budget.py) counts the CPU of each test's process and of the
processes it started and waited for, or still running when a phase ends. It cannot see what the
Docker daemon runs for a test (containers, image builds: their parents are the daemon's shims, not
the test), and a process that ends between two reads is missed. BSD process accounting records every
process of the machine when it ends, containers' included (the kernel writes a container's process
to the accounting file of every pid namespace above it). So on a root shell:

    apt-get install acct
    accton /tmp/suite.pacct             # the kernel appends one 64-byte record per process that ends
    SGRPO_TEST_BUDGET_OUT=/tmp/modules.json make test
    accton off
    .venv/bin/python scripts/cpu_by_module.py /tmp/suite.pacct /tmp/modules.json

A process is charged to the module that was running on its xdist worker when it started (found by
walking its parents up to a worker); a process below a container shim or the Docker daemon is
charged to the Docker-marked modules running when it started, split evenly between them. The
workers' own CPU is one lump at their exit and is left to the clock's per-module figures.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import struct
import sys
from pathlib import Path

RECORD = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")  # struct acct_v3 (linux/acct.h), 64 bytes
ACCT_V3 = 3
TICKS_PER_S = 100  # AHZ: the unit of ac_utime / ac_stime / ac_etime
DOCKER_ROOTS = ("containerd-shim", "dockerd", "containerd", "buildkitd")
REPO = Path(__file__).resolve().parent.parent


def docker_modules(root: Path = REPO) -> set[str]:
    """The test modules with Docker-marked tests (``pytest.mark.docker``): the ones a container's
    process can belong to."""
    return {f"tests/{f.name}" for f in (root / "tests").glob("test_*.py") if "mark.docker" in f.read_text()}


@dataclasses.dataclass(frozen=True)
class Process:
    """One ended process: its CPU seconds (user + system), when it started (epoch s), how long it
    lived, its name. The kernel writes the name its last thread had, so a multithreaded process
    often shows a thread's name (``jemalloc_bg_thd``, ``grpc_global_tim``), not its program's."""

    pid: int
    ppid: int
    start: int
    cpu_s: float
    comm: str
    elapsed_s: float = 0.0


def comp_t(value: int) -> int:
    """The kernel's 16-bit float: a 13-bit mantissa and a 3-bit exponent of base 8."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 0x7))


def read_accounting(path: Path) -> list[Process]:
    """The v3 records of an accounting file (another version is named, not guessed at)."""
    raw = path.read_bytes()
    out = []
    for offset in range(0, len(raw) - RECORD.size + 1, RECORD.size):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, etime, utime, stime,
         *_rest, comm) = RECORD.unpack_from(raw, offset)
        if version & 0x0F != ACCT_V3:
            raise ValueError(f"{path}: record {offset // RECORD.size} is accounting version {version & 0x0F}, "
                             f"not {ACCT_V3} (acct v3, Linux's default)")
        out.append(Process(pid, ppid, btime, (comp_t(utime) + comp_t(stime)) / TICKS_PER_S,
                           comm.split(b"\0", 1)[0].decode(errors="replace"), etime / TICKS_PER_S))
    return out


def find_workers(procs: list[Process], workers: list[str]) -> tuple[int, dict[int, str]]:
    """The pytest process ``make`` started (its longest-lived child) and xdist's workers (that
    process's longest-lived children, named in pid order: gw0 starts first). Names cannot be used:
    the kernel records a thread's. Raises where the run was not ``make test``'s shape."""
    by_parent = collections.defaultdict(list)
    for p in procs:
        by_parent[p.ppid].append(p)
    for make in sorted((p for p in procs if p.comm == "make"), key=lambda p: -p.elapsed_s):
        if not by_parent[make.pid]:
            continue
        main = max(by_parent[make.pid], key=lambda p: p.elapsed_s)
        kids = sorted(by_parent[main.pid], key=lambda p: -p.elapsed_s)[:len(workers)]
        if len(kids) == len(workers):
            return main.pid, {k.pid: w for k, w in zip(sorted(kids, key=lambda k: k.pid), sorted(workers))}
    raise ValueError(f"no pytest process with {len(workers)} children under make in the accounting file")


def charge(procs: list[Process], profile: dict, docker: set[str]) -> tuple[dict, dict]:
    """{module: {"tests": s, "docker": s}} and {module: Counter(comm -> s)}. Three keys hold the
    rest: ``"(outside the tests)"`` what started before the first test or after the last
    (installs, image builds), ``"(controller)"`` pytest's own process, ``"(none)"`` what started
    during the tests under no worker and no daemon (reparented to init)."""
    workers = sorted({row["worker"] for row in profile["timeline"]})
    t0 = profile["t0"]
    t1 = t0 + max(row["to_s"] for row in profile["timeline"])
    spans = collections.defaultdict(list)  # worker -> [(from, to, module)] in epoch seconds
    for row in profile["timeline"]:
        spans[row["worker"]].append((t0 + row["from_s"], t0 + row["to_s"], row["module"]))
    controller, worker_of = find_workers(procs, workers)
    by_pid = {p.pid: p for p in procs}
    totals: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"tests": 0.0, "docker": 0.0})
    names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def running(worker: str, at: int) -> str | None:
        # whole seconds: a process started in the second a module began counts as the module's
        hits = [m for a, b, m in spans[worker] if int(a) <= at <= b]
        return hits[-1] if hits else None

    for p in procs:
        if p.pid in worker_of:
            continue  # the worker's own CPU: the clock's per-module "own" figure
        if p.pid == controller or not int(t0) <= p.start <= t1:
            key = "(controller)" if p.pid == controller else "(outside the tests)"
            totals[key]["tests"] += p.cpu_s
            names[key][p.comm] += p.cpu_s
            continue
        worker, in_docker, seen, node = None, False, set(), p
        while node is not None and node.pid not in seen:
            seen.add(node.pid)
            if node.ppid in worker_of:
                worker = worker_of[node.ppid]
                break
            if node.comm.startswith(DOCKER_ROOTS):
                in_docker = True
                break
            node = by_pid.get(node.ppid)
        if worker is not None:
            module = running(worker, p.start) or "(none)"
            totals[module]["tests"] += p.cpu_s
            names[module][p.comm] += p.cpu_s
        elif in_docker:
            mods = [m for w in workers if (m := running(w, p.start)) in docker] or ["(none)"]
            for m in mods:
                totals[m]["docker"] += p.cpu_s / len(mods)
                names[m]["docker: " + p.comm] += p.cpu_s / len(mods)
        else:
            totals["(none)"]["tests"] += p.cpu_s
            names["(none)"][p.comm] += p.cpu_s
    return dict(totals), dict(names)


def table(profile: dict, totals: dict, names: dict, rows: int = 25, cores: int = 2) -> str:
    """The modules by all the CPU they caused: own (the clock's), started (accounting), Docker."""
    own = {m: c["own_s"] for m, c in profile.get("cpu", {}).items()}
    mods = set(own) | set(totals)
    every = {m: own.get(m, 0.0) + totals.get(m, {}).get("tests", 0.0) + totals.get(m, {}).get("docker", 0.0)
             for m in mods}
    lines = ["| module | wall s | CPU s | own | started | Docker | largest process names (CPU s) |",
             "|---|---|---|---|---|---|---|"]
    for m in sorted(mods, key=lambda m: -every[m])[:rows]:
        top = ", ".join(f"{n} {s:.0f}" for n, s in names.get(m, collections.Counter()).most_common(4) if s >= 1)
        t = totals.get(m, {})
        lines.append(f"| {m} | {profile['modules'].get(m, 0.0):.0f} | {every[m]:.0f} | {own.get(m, 0.0):.0f} | "
                     f"{t.get('tests', 0.0):.0f} | {t.get('docker', 0.0):.0f} | {top} |")
    during = {m: v for m, v in every.items() if m != "(outside the tests)"}
    docker = sum(t["docker"] for m, t in totals.items() if m != "(outside the tests)")
    wall = max(r["to_s"] for r in profile["timeline"]) - min(r["from_s"] for r in profile["timeline"])
    lines.append(f"\nCPU while the tests ran {sum(during.values()) / 60:.1f} min, of which Docker's {docker / 60:.1f}; "
                 f"the {wall / 60:.1f} min of tests offered {cores * wall / 60:.1f} core-minutes on {cores} cores; "
                 f"before and after them {every.get('(outside the tests)', 0.0) / 60:.1f} min")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pacct", type=Path, help="the accounting file accton wrote during the run")
    p.add_argument("profile", type=Path, help="the run's SGRPO_TEST_BUDGET_OUT file (tests/time_budget.py)")
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="the machine's cores (default: this one's)")
    args = p.parse_args(argv)
    try:
        profile = json.loads(args.profile.read_text())
        if "t0" not in profile:
            raise ValueError(f"{args.profile} has no t0 (written before tests/time_budget.py recorded it)")
        totals, names = charge(read_accounting(args.pacct), profile, docker_modules())
    except (OSError, ValueError) as err:
        print(f"cpu_by_module: {err}", file=sys.stderr)
        return 2
    print(table(profile, totals, names, args.rows, args.cores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
