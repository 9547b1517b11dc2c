"""scripts/cpu_by_module.py: a test run's CPU by module from the kernel's process accounting, the
Docker daemon's processes included. The accounting file is written here record by record in the
kernel's acct_v3 layout; one record from a real `accton` run checks that layout."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("cpu_by_module", ROOT / "scripts" / "cpu_by_module.py")
cpu_by_module = sys.modules.setdefault("cpu_by_module", importlib.util.module_from_spec(SPEC))
SPEC.loader.exec_module(cpu_by_module)


def record(pid: int, ppid: int, start: int, cpu_ticks: int, comm: str, version: int = 3, lived_s: float = 1.0) -> bytes:
    """One acct_v3 record; CPU in user ticks (below 8192, so the comp_t mantissa holds it as is)."""
    return cpu_by_module.RECORD.pack(0, version, 0, 0, 0, 0, pid, ppid, start, lived_s * 100, cpu_ticks, 0, 0, 0, 0,
                                     0, 0, 0, comm.encode())


PROFILE = {"t0": 1000.0, "modules": {"tests/test_a.py": 120.0, "tests/test_b.py": 10.0, "tests/test_docker.py": 200.0},
           "cpu": {"tests/test_a.py": {"own_s": 40.0, "descendants_s": 50.0}},
           "timeline": [{"module": "tests/test_a.py", "worker": "gw0", "from_s": 0.0, "to_s": 120.0},
                        {"module": "tests/test_b.py", "worker": "gw0", "from_s": 121.0, "to_s": 131.0},
                        {"module": "tests/test_docker.py", "worker": "gw1", "from_s": 0.0, "to_s": 200.0}]}


def test_processes_are_charged_to_the_module_their_worker_ran_and_containers_to_the_docker_module(tmp_path):
    # make, its install step, pytest's controller; gw0 and gw1 (own CPU; named by their last thread)
    # and a short-lived child of the controller; a pip run before the first test
    rows = [record(10, 1, 989, 5, "make", lived_s=215), record(9, 10, 989, 30, "python", lived_s=1),
            record(11, 10, 991, 100, "grpc_global_tim", lived_s=212),
            record(12, 11, 995, 3000, "jemalloc_bg_thd", lived_s=206), record(13, 11, 996, 3000, "python3", lived_s=205),
            record(14, 11, 1001, 10, "python", lived_s=2), record(15, 1, 992, 300, "pip", lived_s=5),
            record(20, 12, 1010, 400, "pt_main_thread"), record(21, 20, 1015, 250, "ray::IDLE"),  # a: a child, a grandchild
            record(22, 12, 1125, 100, "python"),  # b
            record(30, 13, 1010, 50, "docker"),  # gw1's docker CLI: its module's own process tree
            record(40, 1, 900, 10, "containerd-shim"), record(41, 40, 1020, 700, "python3"),  # a container's process
            record(50, 1, 1010, 80, "sleep")]  # reparented to init: no worker, no daemon
    pacct = tmp_path / "pacct"
    pacct.write_bytes(b"".join(rows))
    procs = cpu_by_module.read_accounting(pacct)
    assert procs[7] == cpu_by_module.Process(20, 12, 1010, 4.0, "pt_main_thread", 1.0)
    totals, names = cpu_by_module.charge(procs, PROFILE, {"tests/test_docker.py"})
    assert totals["tests/test_a.py"] == {"tests": 6.5, "docker": 0.0}
    assert totals["tests/test_b.py"] == {"tests": 1.0, "docker": 0.0}
    assert totals["tests/test_docker.py"] == {"tests": 0.5, "docker": 7.0}
    assert totals["(controller)"] == {"tests": 1.0, "docker": 0.0}
    # make, its install step and the pip run started before the first test; the shim too
    assert totals["(outside the tests)"] == pytest.approx({"tests": 0.05 + 0.3 + 3.0 + 0.1, "docker": 0.0})
    assert totals["(none)"] == pytest.approx({"tests": 0.1 + 0.8, "docker": 0.0})  # the short child, init's orphan
    assert names["tests/test_docker.py"]["docker: python3"] == 7.0
    text = cpu_by_module.table(PROFILE, totals, names, cores=2)
    assert "| tests/test_a.py | 120 | 46 | 40 | 6 | 0 | pt_main_thread 4, ray::IDLE 2 |" in text  # own 40 + 6.5 started
    assert "of which Docker's 0.1; the 3.3 min of tests offered 6.7 core-minutes on 2 cores; before and after them 0.1 min" in text


def test_comp_t_is_the_kernels_base_8_float():
    assert cpu_by_module.comp_t(0x1FFF) == 8191
    assert cpu_by_module.comp_t((2 << 13) | 100) == 100 * 64


def test_another_accounting_version_and_a_profile_without_t0_are_named(tmp_path, capsys):
    pacct = tmp_path / "pacct"
    pacct.write_bytes(record(1, 0, 0, 0, "x", version=2))
    with pytest.raises(ValueError, match="accounting version 2, not 3"):
        cpu_by_module.read_accounting(pacct)
    old = tmp_path / "old.json"
    old.write_text('{"modules": {}, "timeline": []}')
    assert cpu_by_module.main([str(pacct), str(old)]) == 2
    assert "has no t0" in capsys.readouterr().err


ACCOUNT_A_CHILD = """
import ctypes, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.acct(sys.argv[1].encode()) != 0:
    sys.exit(f"acct: errno {ctypes.get_errno()}")
try:
    subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                    "while time.process_time() - t < 0.5: pass"], check=True)
finally:
    libc.acct(None)
"""


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root and util-linux's unshare")
def test_a_real_accounting_file_reads_with_this_layout(tmp_path):
    """The kernel's own record of a process that burned CPU: its name and about its CPU time. In a
    pid namespace of its own: accounting is per namespace, so the test leaves alone a run's
    accounting of the whole machine (the way this script is used) instead of switching its file."""
    pacct = tmp_path / "real.pacct"
    pacct.touch()
    proc = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", ACCOUNT_A_CHILD, str(pacct)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    mine = [p for p in cpu_by_module.read_accounting(pacct) if p.comm.startswith("python")]
    assert mine and 0.4 <= max(p.cpu_s for p in mine) <= 2.0, mine
