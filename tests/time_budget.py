"""The suite's time, reported where CI's log shows it, and the modules past their budget.

Why: the suite grew from 23 to 39 minutes on one processor in four days (issue #59) and nobody saw
it happen until a fresh-clone run. At the end of every run (the controller's terminal summary, so
it covers both xdist workers) this prints the suite's total test time, its ten slowest set-ups,
calls and modules, and a warning line for every module whose tests took more than 1.5 times
the seconds ``tests/budget.toml`` expects of it. A warning, not a failure: machines differ (AVX2 or
AVX-512, a quiet or a shared box), and the budget is there to make growth visible, not to gate.

``tests/budget.toml`` holds ``[modules]`` with ``"tests/test_x.py" = seconds`` (set-up, calls and
tear-down of every test in the file, as measured on a quiet 2-core machine; say which in the
file's comment). ``SGRPO_TEST_BUDGET_OUT=FILE`` also writes every module's seconds as JSON, the
input for the next budget, with where they went (set-up, calls, tear-down per module) and when
(which xdist worker ran it, from when to when): the profile issue #59 asks for, from CI's own run.
The run also prints each worker's busy minutes and how long it sat idle before the other's last
test ended: with ``--dist loadfile`` a long module handed out last leaves one core waiting.

Seconds of wall time do not say what a module costs the machine: a module that waits on a fault
timeout or a Ray actor's start holds its worker but leaves the cores to the other worker, and
cutting it buys nothing when the suite is CPU-bound. So every phase also records its **CPU
seconds**, measured in the process that ran it: its own (``os.times()``), and those of its
descendants, read live from ``/proc`` at the phase's start and end (an engine core, a Ray
cluster's raylet and the actors it starts, a service) plus those it reaped in between. Processes
of the daemon's (Docker's containers and builds) are not in it; the run says so.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

BUDGET_FILE = Path(__file__).with_name("budget.toml")
OVER = 1.5  # a module is reported once it takes more than this times its budget
SLOWEST = 10
CPU_KEY = "cpu_s"  # a report's user_properties entry: [own, descendants'] CPU seconds of its phase
_TICK = os.sysconf("SC_CLK_TCK")  # /proc/PID/stat's times are in these


def _children(pid: int) -> list[int]:
    """The direct children of every thread of ``pid`` (``/proc/PID/task/TID/children``)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def live_descendants_cpu(root: int | None = None) -> float:
    """CPU seconds of the live descendants of ``root`` (this process): each one's own and those of
    the children it reaped. A Ray cluster's workers are the raylet's children, not ours, and a
    module kills them long before any process of ours waits for them; read live, their seconds
    count where they are spent."""
    total, seen = 0, set()
    todo = _children(os.getpid() if root is None else root)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended between the listing and the read
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime (clock ticks)
        todo += _children(pid)
    return total / _TICK


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU seconds, those of its descendants): user and system time each, the
    descendants' as the children this process reaped plus the live ones' (:func:`live_descendants_cpu`).
    Between two readings the difference is what the descendants spent: a child reaped in between
    moves from the live sum to the reaped one whole. Not counted: a process that ends orphaned
    (reparented to init before anyone of ours reaps it) and Docker's containers (the daemon's)."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system + live_descendants_cpu()


class SuiteClock:
    """Collects every test phase's duration from the reports the controller receives."""

    def __init__(self) -> None:
        self.phases: list[tuple[float, str, str]] = []  # (seconds, when, nodeid)
        self.module_phases: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.spans: dict[str, list] = {}  # module -> [worker, first start, last stop] (epoch seconds)
        self.cpu: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # module -> [own, descendants'] CPU s

    def add(self, report) -> None:
        seconds = float(getattr(report, "duration", 0.0) or 0.0)
        module = report.nodeid.split("::", 1)[0]
        self.phases.append((seconds, report.when, report.nodeid))
        self.module_phases[module][report.when] += seconds
        cpu = dict(getattr(report, "user_properties", None) or ()).get(CPU_KEY)
        if cpu is not None:
            row = self.cpu[module]
            row[0] += float(cpu[0])
            row[1] += float(cpu[1])
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if start is None or stop is None:
            return
        node = getattr(report, "node", None)  # xdist's WorkerController on the controller
        worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
        span = self.spans.setdefault(module, [worker, start, stop])
        span[1], span[2] = min(span[1], start), max(span[2], stop)

    @property
    def modules(self) -> dict[str, float]:
        """Each module's seconds: its phases summed (derived, so the two cannot disagree)."""
        return {m: sum(p.values()) for m, p in self.module_phases.items()}

    def workers(self) -> dict[str, dict[str, float]]:
        """Per worker: the seconds its modules' phases took, and the seconds between its last
        test's end and the suite's (idle, or waiting for the other worker's last module)."""
        if not self.spans:
            return {}
        end = max(stop for _, _, stop in self.spans.values())
        modules = self.modules
        out: dict[str, dict[str, float]] = {}
        for module, (worker, _, stop) in self.spans.items():
            row = out.setdefault(worker, {"busy_s": 0.0, "modules": 0, "idle_at_end_s": float("inf")})
            row["busy_s"] += modules[module]
            row["modules"] += 1
            row["idle_at_end_s"] = min(row["idle_at_end_s"], end - stop)
        return dict(sorted(out.items()))

    def profile(self) -> dict:
        """What SGRPO_TEST_BUDGET_OUT writes: each module's seconds, their split by phase, its CPU
        seconds (own and its descendants'), the worker and the module's span relative to the
        suite's first test, and the workers' rows."""
        t0 = min((start for _, start, _ in self.spans.values()), default=0.0)
        return {"t0": round(t0, 3),  # the epoch second the timeline counts from (scripts/cpu_by_module.py)
                "modules": dict(sorted(self.modules.items())),
                "phases": {m: dict(sorted(p.items())) for m, p in sorted(self.module_phases.items())},
                "cpu": {m: {"own_s": round(own, 2), "descendants_s": round(kids, 2)}
                        for m, (own, kids) in sorted(self.cpu.items())},
                "timeline": sorted(({"module": m, "worker": w, "from_s": round(a - t0, 1), "to_s": round(b - t0, 1)}
                                    for m, (w, a, b) in self.spans.items()), key=lambda r: (r["worker"], r["from_s"])),
                "workers": self.workers()}

    def _split(self, module: str) -> str:
        """`` [set-up 80 %, CPU 0.7 cores, worker gw1]``: where a module's seconds went, how many
        cores it kept busy on average (its CPU seconds over its seconds), and who ran it."""
        phases = self.module_phases[module]
        total = sum(phases.values())
        setup = f"set-up {100 * phases.get('setup', 0.0) / total:.0f} %" if total > 0 else ""
        cores = f"CPU {sum(self.cpu[module]) / total:.1f} cores" if module in self.cpu and total > 0 else ""
        worker = f"worker {self.spans[module][0]}" if module in self.spans else ""
        parts = [p for p in (setup, cores, worker) if p]
        return f"  [{', '.join(parts)}]" if parts else ""

    def cpu_line(self) -> str | None:
        """The suite's CPU minutes against the core-minutes its wall time offered (None without
        CPU figures): how much a cut of CPU work can buy before waits are all that is left."""
        if not self.cpu:
            return None
        own = sum(o for o, _ in self.cpu.values())
        kids = sum(k for _, k in self.cpu.values())
        line = (f"CPU: {(own + kids) / 60:.1f} min ({own / 60:.1f} in the test processes, {kids / 60:.1f} in the "
                "processes they started; Docker's containers and builds not counted)")
        if self.spans:
            wall = max(b for _, _, b in self.spans.values()) - min(a for _, a, _ in self.spans.values())
            cores = os.cpu_count() or 1
            line += f", {100 * (own + kids) / (wall * cores):.0f} % of the {wall * cores / 60:.1f} core-minutes of the run"
        return line

    def over_budget(self, budget: dict[str, float]) -> list[tuple[str, float, float]]:
        """(module, seconds, budget) of the modules past ``OVER`` times their budget."""
        return sorted(((m, s, budget[m]) for m, s in self.modules.items() if m in budget and s > OVER * budget[m]),
                      key=lambda row: -row[1] / row[2])

    def lines(self, budget: dict[str, float]) -> list[str]:
        seconds_of = self.modules  # derived: computed once here
        total = sum(seconds_of.values())
        out = [f"test time: {total / 60:.1f} min in {len(seconds_of)} modules (sum over workers of set-up, calls "
               "and tear-down)"]
        for when, title in (("setup", "set-ups"), ("call", "calls")):
            rows = sorted((p for p in self.phases if p[1] == when), reverse=True)[:SLOWEST]
            out.append(f"the {len(rows)} slowest {title}:")
            out += [f"  {s:7.1f} s  {nodeid}" for s, _, nodeid in rows]
        modules = sorted(seconds_of.items(), key=lambda item: -item[1])[:SLOWEST]
        out.append(f"the {len(modules)} slowest modules (their budget, where tests/budget.toml has one):")
        out += [f"  {s:7.1f} s  {m}" + (f"  (budget {budget[m]:.0f} s)" if m in budget else "") + self._split(m)
                for m, s in modules]
        for module, seconds, expected in self.over_budget(budget):
            out.append(f"warning: {module} took {seconds:.0f} s, {seconds / expected:.1f}x its budget of "
                       f"{expected:.0f} s (tests/budget.toml)")
        cpu = self.cpu_line()
        if cpu:
            out.append(cpu)
        workers = self.workers()
        if len(workers) > 1:
            out.append("workers: " + "; ".join(f"{w} {r['busy_s'] / 60:.1f} min in {r['modules']} modules, idle for the "
                                               f"last {r['idle_at_end_s'] / 60:.1f} min" for w, r in workers.items()))
        unbudgeted = sorted(m for m in seconds_of if m not in budget)
        if budget and unbudgeted:
            out.append(f"(no budget for {len(unbudgeted)} module(s); the slowest unbudgeted: "
                       + ", ".join(f"{m} {seconds_of[m]:.0f} s" for m in sorted(unbudgeted, key=lambda m: -seconds_of[m])[:3])
                       + ")")
        return out


def read_budget(path: Path = BUDGET_FILE) -> dict[str, float]:
    """``[modules]`` of the budget file (empty when there is none); a malformed file names itself."""
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not TOML ({err})") from None
    modules = data.get("modules", {})
    bad = [k for k, v in modules.items() if not isinstance(v, (int, float)) or v <= 0]
    if bad:
        raise ValueError(f"{path}: [modules] needs positive seconds, got {bad[:3]}")
    return {k: float(v) for k, v in modules.items()}


CLOCK = SuiteClock()
_PHASE_START: list[tuple[float, float]] = []  # the CPU seconds when the running phase began


def _mark_phase_start() -> None:
    _PHASE_START[:] = [cpu_seconds()]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    _mark_phase_start()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item) -> None:
    _mark_phase_start()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item) -> None:
    _mark_phase_start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The phase just ended: its CPU seconds ride on its report (user_properties reach xdist's
    controller with the report, where :class:`SuiteClock` sums them per module)."""
    outcome = yield
    if not _PHASE_START:
        return
    (own0, kids0), (own1, kids1) = _PHASE_START.pop(), cpu_seconds()
    # an orphaned child's seconds leave the live sum without reaching ours: never below 0
    outcome.get_result().user_properties.append((CPU_KEY, [round(own1 - own0, 3), round(max(kids1 - kids0, 0.0), 3)]))


def pytest_runtest_logreport(report) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        CLOCK.add(report)  # the controller (or a run without xdist): every worker's reports arrive here


def summary(terminalreporter) -> None:
    """The lines of the module docstring, on the controller (conftest's terminal summary calls it)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is not None or not CLOCK.phases:
        return
    for line in CLOCK.lines(read_budget()):
        terminalreporter.write_line(line)
    out = os.environ.get("SGRPO_TEST_BUDGET_OUT")
    if out:
        Path(out).write_text(json.dumps(CLOCK.profile(), indent=1) + "\n")
