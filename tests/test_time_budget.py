"""The suite's clock (tests/time_budget.py): per-module sums over every phase, the warning past
1.5x a module's budget (and none inside it), the slowest lists, a bad budget file named, and each
phase's CPU seconds measured in a real pytest run with xdist's workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import time_budget


def _report(nodeid: str, when: str, seconds: float):
    return SimpleNamespace(nodeid=nodeid, when=when, duration=seconds)


def test_modules_past_one_and_a_half_times_their_budget_are_named():
    clock = time_budget.SuiteClock()
    for nodeid, when, s in [("tests/test_a.py::t1", "setup", 100.0), ("tests/test_a.py::t1", "call", 60.0),
                            ("tests/test_a.py::t2", "call", 1.0), ("tests/test_b.py::t", "call", 14.0),
                            ("tests/test_c.py::t", "teardown", 5.0)]:
        clock.add(_report(nodeid, when, s))
    assert clock.modules == {"tests/test_a.py": 161.0, "tests/test_b.py": 14.0, "tests/test_c.py": 5.0}
    budget = {"tests/test_a.py": 100.0, "tests/test_b.py": 10.0}  # a: 1.61x, b: 1.4x
    assert clock.over_budget(budget) == [("tests/test_a.py", 161.0, 100.0)]
    lines = clock.lines(budget)
    assert lines[0].startswith("test time: 3.0 min in 3 modules")
    assert any(line.startswith("warning: tests/test_a.py took 161 s, 1.6x its budget of 100 s") for line in lines)
    assert not any("test_b.py took" in line for line in lines)
    assert "   100.0 s  tests/test_a.py::t1" in lines[2]  # the slowest set-up first
    assert any("no budget for 1 module(s)" in line and "tests/test_c.py 5 s" in line for line in lines)
    at = lines.index("the 3 slowest modules (their budget, where tests/budget.toml has one):")
    assert lines[at + 1:at + 4] == ["    161.0 s  tests/test_a.py  (budget 100 s)  [set-up 62 %]",
                                    "     14.0 s  tests/test_b.py  (budget 10 s)  [set-up 0 %]",
                                    "      5.0 s  tests/test_c.py  [set-up 0 %]"]
    assert not any(line.startswith("workers:") for line in lines)  # no xdist workers, no start/stop


def _worker_report(nodeid: str, when: str, worker: str, start: float, stop: float, cpu=None):
    """A report as xdist's controller receives it: ``node`` is the worker's controller."""
    node = SimpleNamespace(gateway=SimpleNamespace(id=worker))
    props = [] if cpu is None else [(time_budget.CPU_KEY, cpu)]
    return SimpleNamespace(nodeid=nodeid, when=when, duration=stop - start, start=start, stop=stop, node=node,
                           user_properties=props)


def test_the_profile_says_where_each_module_went_and_which_worker_waited():
    clock = time_budget.SuiteClock()
    # gw0: a (100 s set-up + 20 s call) then b (10 s); gw1: c from 0 to 200 s, the last to end
    for args in [("tests/test_a.py::t", "setup", "gw0", 1000.0, 1100.0, [30.0, 50.0]),
                 ("tests/test_a.py::t", "call", "gw0", 1100.0, 1120.0, [10.0, 0.0]),
                 ("tests/test_b.py::t", "call", "gw0", 1121.0, 1131.0),
                 ("tests/test_c.py::t1", "call", "gw1", 1000.0, 1150.0, [15.0, 0.0]),
                 ("tests/test_c.py::t2", "call", "gw1", 1150.0, 1200.0, [5.0, 0.0])]:
        clock.add(_worker_report(*args))
    profile = clock.profile()
    assert profile["modules"] == {"tests/test_a.py": 120.0, "tests/test_b.py": 10.0, "tests/test_c.py": 200.0}
    assert profile["phases"]["tests/test_a.py"] == {"call": 20.0, "setup": 100.0}
    assert profile["cpu"] == {"tests/test_a.py": {"own_s": 40.0, "descendants_s": 50.0},
                              "tests/test_c.py": {"own_s": 20.0, "descendants_s": 0.0}}  # b: no CPU figures
    assert profile["t0"] == 1000.0
    assert profile["timeline"] == [
        {"module": "tests/test_a.py", "worker": "gw0", "from_s": 0.0, "to_s": 120.0},
        {"module": "tests/test_b.py", "worker": "gw0", "from_s": 121.0, "to_s": 131.0},
        {"module": "tests/test_c.py", "worker": "gw1", "from_s": 0.0, "to_s": 200.0}]
    assert profile["workers"] == {"gw0": {"busy_s": 130.0, "modules": 2, "idle_at_end_s": 69.0},
                                  "gw1": {"busy_s": 200.0, "modules": 1, "idle_at_end_s": 0.0}}
    lines = clock.lines({})
    assert "workers: gw0 2.2 min in 2 modules, idle for the last 1.1 min; gw1 3.3 min in 1 modules, idle for the last 0.0 min" in lines
    assert "    120.0 s  tests/test_a.py  [set-up 83 %, CPU 0.8 cores, worker gw0]" in lines  # 90 CPU s in 120 s
    assert "    200.0 s  tests/test_c.py  [set-up 0 %, CPU 0.1 cores, worker gw1]" in lines
    cores = os.cpu_count()
    assert (f"CPU: 1.8 min (1.0 in the test processes, 0.8 in the processes they started; Docker's containers "
            f"and builds not counted), {100 * 110 / (200 * cores):.0f} % of the {200 * cores / 60:.1f} core-minutes of the run") in lines
    json.dumps(profile)  # what SGRPO_TEST_BUDGET_OUT writes


def test_a_bad_budget_file_names_itself(tmp_path):
    assert time_budget.read_budget(tmp_path / "none.toml") == {}
    good = tmp_path / "good.toml"
    good.write_text('[modules]\n"tests/test_a.py" = 90\n')
    assert time_budget.read_budget(good) == {"tests/test_a.py": 90.0}
    bad = tmp_path / "bad.toml"
    bad.write_text('[modules]\n"tests/test_a.py" = "soon"\n')
    with pytest.raises(ValueError, match="bad.toml: \\[modules\\] needs positive seconds"):
        time_budget.read_budget(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("[modules\n")
    with pytest.raises(ValueError, match="broken.toml: not TOML"):
        time_budget.read_budget(broken)


def test_the_committed_budget_file_reads():
    assert all(s > 0 for s in time_budget.read_budget().values())


# computes for 0.8 s of CPU time, in whatever process runs it
BURN = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end:\n    pass\n"
MODULES = {
    "test_own.py": "import time\n\n\ndef test_own():\n    exec(BURN)\n",
    "test_child.py": "import subprocess\nimport sys\n\n\ndef test_child():\n"
                     "    subprocess.run([sys.executable, '-c', BURN], check=True)\n",
    "test_sleep.py": "import time\n\n\ndef test_sleep():\n    time.sleep(1.0)\n",
    # as a Ray cluster's actor: a grandchild that computes under a live parent of its own, which
    # never waits for it; killed after the test, it ends unreaped by any process of the run's
    "test_grandchild.py": (
        "import os\nimport signal\nimport subprocess\nimport sys\nimport time\n\nimport pytest\n\n"
        "CHILD = BURN + 'import sys\\nimport time\\nopen(sys.argv[1], \"w\").write(\"x\")\\ntime.sleep(120)\\n'\n"
        "PARENT = ('import subprocess\\nimport sys\\nimport time\\n'\n"
        "          'p = subprocess.Popen([sys.executable, \"-c\", sys.argv[1], sys.argv[2]])\\n'\n"
        "          'print(p.pid, flush=True)\\ntime.sleep(120)\\n')\n\n\n"
        "@pytest.fixture\ndef parent(tmp_path):\n"
        "    flag = tmp_path / 'burnt'\n"
        "    proc = subprocess.Popen([sys.executable, '-c', PARENT, CHILD, str(flag)], stdout=subprocess.PIPE, text=True)\n"
        "    grandchild = int(proc.stdout.readline())\n"
        "    yield flag\n"
        "    os.kill(grandchild, signal.SIGKILL)\n"
        "    proc.kill()\n"
        "    proc.wait()\n\n\n"
        "def test_grandchild(parent):\n"
        "    while not parent.exists():\n"
        "        time.sleep(0.05)\n"),
}


def test_each_phase_s_cpu_seconds_reach_the_controller_from_xdist_workers(tmp_path):
    """A real pytest run in two xdist workers, the clock's hooks registered as tests/conftest.py
    registers them: a module that computes in its own process, one whose child process does, one
    that sleeps, and one whose grandchild computes and is never reaped by a process of the run's.
    Each module's CPU seconds land in SGRPO_TEST_BUDGET_OUT, own and descendants' apart; the
    sleeper's wall seconds come without CPU (the difference the figure is for)."""
    tests = Path(__file__).resolve().parent
    (tmp_path / "conftest.py").write_text(
        f"BURN = {BURN!r}\n"
        "import builtins\nbuiltins.BURN = BURN\n"
        "import time_budget\n"
        "from time_budget import (pytest_runtest_call, pytest_runtest_logreport, pytest_runtest_makereport,\n"
        "                         pytest_runtest_setup, pytest_runtest_teardown)\n\n\n"
        "def pytest_terminal_summary(terminalreporter):\n    time_budget.summary(terminalreporter)\n")
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "modules.json"
    # a fresh run, not a worker of this one (the clock reports on the controller only)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT_TEST"))}
    env.update(PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]), SGRPO_TEST_BUDGET_OUT=str(out))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 passed" in proc.stdout and "\nCPU: " in proc.stdout
    profile = json.loads(out.read_text())
    own, child, sleep, grandchild = (profile["cpu"][name] for name in MODULES)
    assert own["own_s"] >= 0.75 and own["descendants_s"] < 0.05, own
    assert child["descendants_s"] >= 0.75 and child["own_s"] < 0.5, child  # a fork/exec and a wait, no computing
    assert sleep["own_s"] + sleep["descendants_s"] < 0.3 and profile["modules"]["test_sleep.py"] >= 1.0, sleep
    assert grandchild["descendants_s"] >= 0.75, grandchild  # read live: no process of ours ever reaps it
