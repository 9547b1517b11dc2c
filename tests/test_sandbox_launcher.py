"""sgrpo-launch, the local backend's root step (sandbox/launcher): built from source, and it
refuses bad input before anything runs."""

from __future__ import annotations

import subprocess

import pytest

from sandbox.launcher import build_launcher, launcher_path


@pytest.fixture(scope="module")
def launch() -> str:
    path = build_launcher()
    if path is None:
        pytest.fail("no C compiler here: `make install` needs one for the static launcher")
    return path


def _run(launch: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([launch, *args], capture_output=True, text=True, timeout=30)


def test_built_once_and_named_after_the_source(launch):
    assert launch == str(launcher_path())
    assert build_launcher() == launch  # cached: no rebuild


def test_drops_to_the_uid_and_sets_rlimits(launch):
    out = _run(launch, "65534", "65534", "7", "1048576", "64", "--", "/bin/sh", "-c",
               "id -u; id -g; id -G; ulimit -t; ulimit -f; ulimit -n; ulimit -c")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["65534", "65534", "65534", "7", str(1048576 // 512), "64", "0"]


@pytest.mark.parametrize("args, message", [
    (["0", "65534", "5", "1", "1", "--", "/bin/true"], "refusing to run as root"),
    (["65534", "65534", "x", "1", "1", "--", "/bin/true"], "cpu x"),
    (["65534", "65534", "5", "1", "1", "/nonexistent/cgroup.procs", "--", "/bin/true"], "join cgroup"),
    (["65534", "65534", "5", "1", "1", "/bin/true"], "usage"),
    (["65534", "65534", "5", "1", "1", "--", "/nonexistent/prog"], "exec /nonexistent/prog"),
])
def test_bad_input_fails_before_the_program_runs(launch, args, message):
    out = _run(launch, *args)
    assert out.returncode == 127
    assert out.stderr.startswith("sandbox-launch: ") and message in out.stderr


def test_a_launcher_others_could_have_written_is_not_run(tmp_path, monkeypatch):
    """Root execs this file, so a copy (or folder) writable by group/others is refused."""
    import os

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    monkeypatch.setenv("SGRPO_CACHE", str(cache))
    built = build_launcher()
    assert built is not None and built.startswith(str(cache))
    os.chmod(built, 0o775)
    assert build_launcher() is None
    os.chmod(built, 0o755)
    assert build_launcher() == built
    os.chmod(cache, 0o777)
    assert build_launcher() is None
