"""One isolation suite, run for real against every backend: the local warm pool (bwrap + cgroup),
the local cold mode (a fresh sandbox per run) and the Docker pool; in every one the sandbox's
resident runner spawns the runs.

The leaks a warm design invites (a file, a process, an environment variable, an imported module,
an IPC object, a held lock, a key, a TIME_WAIT socket, pid 1's limits, a scratch root's metadata)
are each checked twice: no backend hands them to a later run, and a naive pool (the same sandbox,
but one interpreter for every job and no cleanup: NAIVE_MAIN) does, so each check can fail.

Docker cases are marked `docker` and skip with the printed reason only when the environment lacks
a piece (no engine answers, or the image is not built: `scripts/docker_ci.sh start &&
scripts/docker_ci.sh build-image`); any other failure of the backend fails the test.
"""

from __future__ import annotations

import base64
import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from shm_check import live_names, marked_processes, reap_adopted

from sandbox.api import Outcome, parse_run_request
from sandbox.backends.base import EnvironmentMissing

POOL = 4
CAP = 4096
FINISHED, TIMEOUT, MEMORY = Outcome.FINISHED, Outcome.TIMEOUT, Outcome.MEMORY


def _make_local(mode: str = "resident"):
    from sandbox.backends.local import LocalBackend

    backend = LocalBackend(pool_size=POOL, mode=mode)
    missing = backend.probe().missing
    if missing:
        backend.close()
        pytest.fail(f"local isolation incomplete on this host: {missing}")
    return backend


def _docker_backend(pool_size: int = POOL):
    """A Docker pool; a skip with the printed reason only when no engine answers or the image is missing."""
    from sandbox.backends.docker_pool import DockerBackend

    try:
        return DockerBackend(pool_size=pool_size)
    except EnvironmentMissing as err:
        print(err)
        pytest.skip(str(err))


def _make_docker():
    backend = _docker_backend()
    missing = backend.probe().missing
    if missing:
        backend.close()
        pytest.fail(f"docker isolation incomplete: {missing}")
    return backend


@pytest.fixture(scope="module", params=["local", pytest.param("local-cold", marks=pytest.mark.slow),
                                        pytest.param("docker", marks=pytest.mark.docker)])
def backend(request):
    """The local warm pool, the local cold mode and the Docker pool."""
    b = {"local": _make_local, "local-cold": lambda: _make_local("cold"), "docker": _make_docker}[request.param]()
    yield b
    b.close()


def run(backend, code: str, **kw):
    return backend.run(parse_run_request({"code": code, "language": "python", **kw}), CAP)


def leftover_cgroups() -> list[str]:
    """sgrpo sandbox cgroup dirs that exist right now."""
    from sandbox.cgroups import LEAF_PREFIX

    found = []
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(root, d) for d in dirs if d.startswith(LEAF_PREFIX)]
        dirs[:] = [d for d in dirs if not d.startswith(LEAF_PREFIX)]
    return found


def test_print_and_exit_code(backend):
    ok = run(backend, "print('hi')")
    assert (ok.outcome, ok.return_code, ok.stdout) == (FINISHED, 0, "hi\n")
    bad = run(backend, "import sys\nprint('x', file=sys.stderr)\nsys.exit(3)")
    assert (bad.outcome, bad.return_code, bad.stderr) == (FINISHED, 3, "x\n")


@pytest.mark.parametrize("code", [152, 200, 137, 255])
def test_exit_codes_above_128_are_exit_codes(backend, code):
    """A program's own exit status is Finished with that code, however large; only the service's
    own kill is a time-out (SIGXCPU is no longer a limit: 152 = 128 + SIGXCPU)."""
    res = run(backend, f"import sys\nsys.exit({code})")
    assert (res.outcome, res.return_code) == (FINISHED, code), res


@pytest.mark.parametrize("code, signum", [
    ("import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)", 9),
    ("import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)", 15),
    ("import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)", 11),
    ("import os\nprint('before', flush=True)\nos.abort()", 6),
    ("import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGINT)", 2),  # KeyboardInterrupt
])
def test_a_death_by_signal_is_finished_minus_the_signal(backend, code, signum):
    """A signal the program gets from itself is its own ending (Finished), never a time-out or a
    sandbox error, and its status is -N, as SandboxFusion's asyncio runner reports it (distinct from
    `exit(128 + N)`, tested above)."""
    res = run(backend, code)
    assert (res.outcome, res.return_code, res.stdout) == (FINISHED, -signum, "before\n"), res


PID1_PROBE = ("import os, signal\nfor sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):\n"
              "    os.kill(1, sig)\nfor path in ('/proc/1/mem', '/proc/1/environ'):\n"
              "    try:\n        open(path, 'rb').read(1)\n        print('READ', path)\n"
              "    except OSError as e:\n        print('denied', e.errno)\n"
              "try:\n    print('FDS', os.listdir('/proc/1/fd'))\nexcept OSError as e:\n    print('denied', e.errno)\n"
              "raise SystemExit(3)\n")


def test_pid_1_is_out_of_the_codes_reach(backend):
    """The process that reports the program's status (the local init, the Docker resident runner)
    shares its uid but is pid 1 of the pid namespace with no handlers, and non-dumpable: the code
    can neither signal it nor reach its memory or its report fd, so the status stays its own."""
    replaced = getattr(backend, "replaced", 0)
    for _ in range(POOL):  # every container of a pool
        res = run(backend, PID1_PROBE)
        assert (res.outcome, res.return_code, res.stdout.split()) == (FINISHED, 3, ["denied", "13"] * 3), res
    assert run(backend, "print('alive')").stdout == "alive\n"
    assert getattr(backend, "replaced", 0) == replaced  # no runner died: a pool never had to heal


TRACEBACK = ("Traceback (most recent call last):\n"
             '  File "/work/main.py", line 3, in <module>\n    f()\n'
             '  File "/work/main.py", line 2, in f\n    return 1 / 0\n           ~~^~~\n'
             "ZeroDivisionError: division by zero\n")


@pytest.mark.parametrize("code, stdout, stderr", [
    ("def f():\n    return 1 / 0\nf()", "", TRACEBACK),
    ("x = (", "", '  File "/work/main.py", line 1\n    x = (\n        ^\nSyntaxError: \'(\' was never closed\n'),
    ("import sys, os\nprint(sys.argv, __file__, sys.path[0], os.getcwd(), __name__)", "['main.py'] /work/main.py /work /work __main__\n", ""),
    ("import sys\nprint(sorted(m for m in ('json', 'base64', 'runpy') if m in sys.modules))", "[]\n", ""),
    ("import warnings\nwarnings.warn('w')", "", "/work/main.py:2: UserWarning: w\n  warnings.warn('w')\n"),
], ids=["traceback", "syntax error", "argv and paths", "fresh interpreter", "warning"])
def test_the_program_sees_what_python3_main_py_sees(backend, code, stdout, stderr):
    """Every backend runs `python3 -E -s main.py` in /work, so what a policy reads back (tracebacks
    above all) does not depend on the backend: no frame, path or module of a launcher shows."""
    res = run(backend, code)
    assert (res.stdout, res.stderr) == (stdout, stderr), res


def test_launcher_lookalike_output_is_the_programs_output(backend):
    """Output that starts like a launcher or bwrap error is still the program's own."""
    res = run(backend, "import sys\nprint('bwrap: Can\\'t mount', file=sys.stderr)\n"
                       "print('sandbox-launch: x', file=sys.stderr)\nprint('sgrpo-sandbox: clean')\nprint('kept')")
    assert res.outcome is FINISHED and res.sandbox_error is None, res
    assert res.stdout == "sgrpo-sandbox: clean\nkept\n" and res.stderr.startswith("bwrap: "), res


def test_network_blocked(backend):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        res = run(backend, f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                           f"    print('REACHED')\nexcept OSError as e:\n    print('blocked', e)")
    assert res.stdout.startswith("blocked"), res


def test_root_readonly_workdir_writable_non_root(backend):
    res = run(backend, "import os\ntry:\n    open('/etc/evil', 'w'); print('ROOT WRITABLE')\nexcept OSError:\n"
                       "    print('ro')\nopen('/work/ok.txt', 'w').write('x')\nprint(os.listdir('/work'), os.getuid())")
    lines = res.stdout.splitlines()
    assert lines[0] == "ro", res
    assert "ok.txt" in lines[1] and not lines[1].endswith(" 0"), res


def test_two_gigabytes_is_memory_limit_exceeded(backend):
    res = run(backend, "x = bytearray(2 * 1024**3)\nprint('allocated')", memory_limit_MB=256)
    assert res.outcome is MEMORY, res
    assert "allocated" not in res.stdout


def test_a_tiny_memory_limit_is_raised_to_the_floor(backend):
    """memory_limit_MB=1 (SandboxFusion accepts any integer) becomes 32 MB: the interpreter (and a
    Docker container's pid 1) still fit, and a program over it is a memory kill, not a lost sandbox."""
    assert run(backend, "print('fits')", memory_limit_MB=1).stdout == "fits\n"
    res = run(backend, "x = bytearray(100 << 20)", memory_limit_MB=1)
    assert res.outcome is MEMORY, res


def test_scratch_space_is_capped_everywhere(backend):
    """/work, /tmp and /dev/shm are each a 64 MiB tmpfs (files of 40 MB stay under RLIMIT_FSIZE);
    /dev itself is read-only."""
    code = ("import errno\nfor d in ('/work', '/tmp', '/dev/shm'):\n    try:\n"
            "        for i in range(3):\n            open(f'{d}/f{i}', 'wb').write(b'x' * (40 << 20))\n"
            "        print(d, 'UNCAPPED')\n    except OSError as e:\n        print(d, errno.errorcode[e.errno])\n"
            "    import os\n    for i in range(3):\n        try: os.remove(f'{d}/f{i}')\n        except OSError: pass\n"
            "try:\n    open('/dev/evil', 'wb')\n    print('/dev WRITABLE')\nexcept OSError as e:\n"
            "    print('/dev', errno.errorcode[e.errno])\n")
    res = run(backend, code, memory_limit_MB=1024, run_timeout=30)
    assert res.stdout.splitlines()[:3] == ["/work ENOSPC", "/tmp ENOSPC", "/dev/shm ENOSPC"], res
    assert res.stdout.splitlines()[3] in ("/dev EROFS", "/dev EACCES"), res


def test_fork_bomb_contained(backend):
    res = run(backend, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
              run_timeout=2)
    assert res.outcome is TIMEOUT and res.return_code is None, res
    after = run(backend, "print('still fine')")
    assert after.stdout == "still fine\n"


ORPHAN_STORM = ("import os\nmade = 0\nfor _ in range(200):\n    pid = os.fork()\n    if pid == 0:\n"
                "        try:\n            if os.fork() == 0:\n                os._exit(0)\n"
                "        except OSError:\n            os._exit(1)\n        os._exit(0)\n"
                "    made += os.waitpid(pid, 0)[1] == 0\nprint(made)\n")


def test_orphans_are_reaped_while_the_program_runs(backend):
    """200 short-lived orphans, one after another, under pids.max = 64: pid 1 must reap each as it
    exits (zombies count against the limit), or the program's forks start to fail."""
    res = run(backend, ORPHAN_STORM, run_timeout=30)
    assert (res.outcome, res.return_code, res.stdout, res.stderr) == (FINISHED, 0, "200\n", ""), res


def test_setsid_grandchild_killed_at_timeout(backend):
    marker = f"sgrpo-escapee-{uuid.uuid4().hex}"
    code = (f"import os, sys\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'while True: pass', '{marker}'])\n"
            f"    os._exit(0)\nwhile True:\n    pass\n")
    res = run(backend, code, run_timeout=1.5)
    assert res.outcome is TIMEOUT, res
    assert marked_processes(marker) == []


def test_stdout_flood_is_cut(backend):
    res = run(backend, "import sys\nwhile True:\n    sys.stdout.write('y' * 4096)", run_timeout=1)
    assert res.outcome is TIMEOUT
    assert res.stdout.startswith("y" * CAP) and "output truncated by sandbox" in res.stdout
    assert len(res.stdout) < CAP + 200


def test_stdin_and_injected_files(backend):
    files = {"data/in.txt": base64.b64encode(b"from a file").decode(),
             "helper.py": base64.b64encode(b"VALUE = 42\n").decode(),
             "/tmp/abs/t.txt": base64.b64encode(b"abs").decode(), "skipped.txt": None}
    res = run(backend, "import helper, os\nprint(input().upper(), open('data/in.txt').read(), helper.VALUE,\n"
                       "      open('/tmp/abs/t.txt').read(), os.path.exists('skipped.txt'))",
              stdin="hello\n", files=files)
    assert res.stdout == "HELLO from a file 42 abs False\n", res


def test_fetch_files_returns_what_the_run_wrote(backend):
    """SandboxFusion's fetch_files: regular files come back base64; a missing name, a directory or a
    FIFO is left out (a FIFO is never opened for a blocking read)."""
    code = ("import os\nopen('out.txt', 'w').write('result')\nos.makedirs('d/e')\nopen('d/e/f.bin', 'wb').write(bytes(range(256)))\n"
            "os.mkfifo('pipe')\nopen('/tmp/t.txt', 'w').write('tmp')\n")
    res = run(backend, code, fetch_files=["out.txt", "d/e/f.bin", "/tmp/t.txt", "missing", "d", "pipe"])
    assert res.outcome is FINISHED and res.notes == [], res
    assert {k: base64.b64decode(v) for k, v in res.files.items()} == {
        "out.txt": b"result", "d/e/f.bin": bytes(range(256)), "/tmp/t.txt": b"tmp"}


def test_fetch_files_come_back_after_a_time_out(backend):
    """SandboxFusion reads fetch_files after the run whatever its status, a time-out included: the
    files written before the deadline come back, and the run and its setsid heir are still killed."""
    marker = f"sgrpo-heir-{uuid.uuid4().hex}"
    code = ("import os, subprocess, sys, time\nopen('out.txt', 'w').write('partial')\n"
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}], start_new_session=True)\n"
            "print('written', flush=True)\nwhile True:\n    time.sleep(0.01)\n")
    res = run(backend, code, run_timeout=1.5, fetch_files=["out.txt"])
    assert (res.outcome, res.stdout, res.notes) == (TIMEOUT, "written\n", []), res
    assert {k: base64.b64decode(v) for k, v in res.files.items()} == {"out.txt": b"partial"}
    assert marked_processes(marker) == []


def test_fetched_files_are_streamed_not_held_in_the_runs_memory(backend):
    """A 12 MiB file fetched from a run with a 64 MiB memory limit: the file already sits in the
    run's tmpfs, charged to its cgroup, so a collector holding it, its base64 and a JSON copy was
    killed for memory and a run that finished was reported as a memory kill."""
    import hashlib

    code = ("import hashlib, os\ndata = os.urandom(12 << 20)\nopen('big.bin', 'wb').write(data)\n"
            "print(hashlib.sha256(data).hexdigest())")
    res = run(backend, code, memory_limit_MB=64, fetch_files=["big.bin"], run_timeout=30)
    assert (res.outcome, res.return_code, res.notes) == (FINISHED, 0, []), res
    data = base64.b64decode(res.files["big.bin"])
    assert (len(data), hashlib.sha256(data).hexdigest() + "\n") == (12 << 20, res.stdout)


def test_no_state_leaks_between_runs(backend):
    first = run(backend, "open('/work/secret', 'w').write('1'); open('/tmp/secret', 'w').write('1')\n"
                         "import os; print(sorted(os.listdir('/work')))")
    assert "secret" in first.stdout
    for _ in range(POOL + 1):  # every pooled slot/container gets visited
        res = run(backend, "import os; print(os.path.exists('/work/secret'), os.path.exists('/tmp/secret'))")
        assert res.stdout == "False False\n", res


HOSTILE_LEFTOVERS = ("import os\nos.chdir('/work')\nfor _ in range(1500):  # deeper than Python's recursion limit\n"
                     "    os.mkdir('d')\n    os.chdir('d')\nopen('bottom', 'w').write('x')\n"
                     "os.makedirs('/tmp/locked/inner')\nopen('/tmp/locked/inner/f', 'w').write('x')\n"
                     "os.chmod('/tmp/locked/inner', 0)\nos.chmod('/tmp/locked', 0o500)\n"
                     "open('/dev/shm/.hidden', 'w').write('x')\nos.symlink('/etc/passwd', '/work/link')\nprint('made')\n")
SCRATCH_LOOK = "import os\nprint([os.listdir(d) for d in ('/work', '/tmp', '/dev/shm')])"


def test_hostile_leftovers_are_wiped_without_losing_the_container(backend):
    """A deep tree, unreadable and unwritable dirs, dotfiles and a symlink out: the next runs start
    with empty scratch dirs, and a pooled container is wiped, not refused and replaced."""
    replaced = getattr(backend, "replaced", 0)
    assert run(backend, HOSTILE_LEFTOVERS).stdout == "made\n"
    for _ in range(POOL + 1):  # every pooled slot/container gets visited
        res = run(backend, SCRATCH_LOOK)
        assert (res.outcome, res.stdout) == (FINISHED, "[['main.py'], [], []]\n"), res
    assert getattr(backend, "replaced", 0) == replaced


IPC_MAKE = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.shmget(0x5eed, 4096, 0o1600) >= 0, libc.semget(0x5eed, 1, 0o1600) >= 0,\n"
            "      libc.msgget(0x5eed, 0o1600) >= 0, libc.mq_open(b'/sgrpo-leak', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0)\n")
IPC_LOOK = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "left = [line for t in ('shm', 'sem', 'msg') for line in open(f'/proc/sysvipc/{t}').read().splitlines()[1:]]\n"
            "print(left, libc.mq_open(b'/sgrpo-leak', os.O_RDONLY) >= 0)\n")


def test_no_ipc_objects_outlive_a_run(backend):
    """SysV shared memory, semaphores and message queues and POSIX message queues outlive every
    process of their IPC namespace: a pooled container must not hand them to the next run."""
    made = run(backend, IPC_MAKE)
    assert made.stdout == "True True True True\n", made
    for _ in range(POOL + 1):  # every pooled slot/container gets visited
        res = run(backend, IPC_LOOK)
        assert res.stdout == "[] False\n", res


# ---- the leaks a warm design invites ------------------------------------------------------------
# name: (plant, look). `look` prints what a run can see of the leak; a run after `plant` must print
# what a run before it printed. Each plant must take (the naive pool shows the look then differs).
PORT = 18555
LOCKED = ("import fcntl, os\nout = []\nfor path in ('/tmp/sgrpo.lock', os.__file__):\n"
          "    with open(path, 'a' if path.startswith('/tmp') else 'rb') as fh:\n"
          "        try:\n            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)\n            out.append('free')\n"
          "        except BlockingIOError:\n            out.append('held')\nprint(out)\n")
KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(os.uname().machine)  # add_key, keyctl
WARM_LEAKS = {
    "files in the work dir, /tmp and /dev/shm": (
        "for d in ('/work', '/tmp', '/dev/shm'):\n    open(f'{d}/left', 'w').write('x')\n",
        "import os\nprint([os.path.exists(f'{d}/left') for d in ('/work', '/tmp', '/dev/shm')])\n"),
    "a background process": (
        "import os, time\nr, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.write(w, b'x')\n        time.sleep(120)\n    os._exit(0)\nos.read(r, 1)\n",
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())))\n"),
    "an environment variable": (
        "import os\nos.environ['SGRPO_LEAK'] = '1'\nos.putenv('SGRPO_LEAK_C', '1')\n",
        "import os\nprint(os.environ.get('SGRPO_LEAK'), os.environ.get('SGRPO_LEAK_C'))\n"),
    "sys.modules and builtins": (
        "import builtins, json, sys, types\nsys.modules['sgrpo_leak'] = types.ModuleType('sgrpo_leak')\n"
        "builtins.sgrpo_leak = 1\n",
        "import builtins, sys\nprint('sgrpo_leak' in sys.modules, hasattr(builtins, 'sgrpo_leak'), 'json' in sys.modules)\n"),
    "SysV and POSIX IPC objects": (IPC_MAKE, IPC_LOOK),
    "a held lock": (
        "import fcntl, os, time\nr, w = os.pipe()\nif os.fork() == 0:\n    os.setsid()\n"
        "    held = [open('/tmp/sgrpo.lock', 'a'), open(os.__file__, 'rb')]\n"
        "    for fh in held:\n        fcntl.flock(fh, fcntl.LOCK_EX)\n    os.write(w, b'x')\n    time.sleep(120)\n"
        "    os._exit(0)\nos.read(r, 1)\n",
        LOCKED),
    "a key in the user keyring": (
        f"import ctypes\nctypes.CDLL(None).syscall({KEYCTL and KEYCTL[0]}, b'user', b'sgrpo-leak', b'secret', 6, -4)\n",
        f"import ctypes\nprint(ctypes.CDLL(None).syscall({KEYCTL and KEYCTL[1]}, 10, -4, b'user', b'sgrpo-leak', 0) >= 0)\n"),
    "a TIME_WAIT socket on a port": (
        f"import socket\ns = socket.socket()\ns.bind(('127.0.0.1', {PORT}))\ns.listen()\n"
        f"c = socket.create_connection(('127.0.0.1', {PORT}))\na, _ = s.accept()\na.close()\nc.recv(1)\nc.close()\ns.close()\n",
        f"import socket\ntry:\n    socket.socket().bind(('127.0.0.1', {PORT}))\n    print('bound')\n"
        "except OSError as e:\n    print(e.errno)\n"),
    "pid 1's rlimits, priority and CPU affinity": (
        "import os, resource\nresource.prlimit(1, resource.RLIMIT_NOFILE, (64, 256))\n"
        "resource.prlimit(1, resource.RLIMIT_NPROC, (1000, 1000))\nos.setpriority(os.PRIO_PROCESS, 1, 7)\n"
        "os.sched_setaffinity(1, {min(os.sched_getaffinity(1))})\n",
        "import os, resource\nprint([resource.getrlimit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC)],\n"
        "      os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)))\n"),
    "a scratch root's mode, atime and xattrs": (
        "import os\nfor call in (lambda: os.setxattr('/work', 'user.sgrpo', b'1'), lambda: os.chmod('/tmp', 0o700),\n"
        "             lambda: os.utime('/work', (12345, 12345))):\n    try:\n        call()\n"
        "    except OSError:\n        pass\n",
        "import os\ntry:\n    x = os.listxattr('/work')\nexcept OSError:\n    x = []\n"
        "print(x, oct(os.stat('/tmp').st_mode), os.stat('/work').st_atime == 12345)\n"),
}


def leak_seen(backend, plant: str, look: str, visits: int) -> list[str]:
    """What `visits` runs after `plant` printed that a run before it did not (empty: nothing leaked)."""
    before = run(backend, look)
    assert (before.outcome, before.return_code) == (FINISHED, 0), before
    planted = run(backend, plant)
    assert (planted.outcome, planted.return_code) == (FINISHED, 0), planted
    seen = [run(backend, look) for _ in range(visits)]
    return [r.stdout or r.stderr for r in seen if (r.outcome, r.stdout) != (FINISHED, before.stdout)]


@pytest.mark.parametrize("leak", list(WARM_LEAKS))
def test_nothing_a_run_leaves_reaches_a_later_run(backend, leak):
    """Every pooled sandbox is visited after the plant; each must look as it did before it."""
    if "keyring" in leak and KEYCTL is None:
        pytest.skip(f"no keyctl syscall numbers for {os.uname().machine}")
    assert leak_seen(backend, *WARM_LEAKS[leak], visits=POOL + 1) == []


# The naive runner: the resident runner's own definitions (frames, writing files), then a main loop
# that runs every job with `exec` in its one long-lived interpreter and never kills, wipes or checks.
NAIVE_MAIN = """
import contextlib, io


def naive_run(code):
    out, err, rc = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(code, SCRIPT, "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            rc = 1
    return rc, out.getvalue().encode(), err.getvalue().encode()


write_frame(json.dumps({"ready": True, "oom_kills": -1}).encode())
while True:
    job, stdin = json.loads(read_frame()), read_frame()
    write_frame(b'{"accepted": true}')
    write_files(job["code"], job["files"])
    start = time.monotonic()
    rc, out, err = naive_run(job["code"])
    write_frame(json.dumps({"rc": rc, "elapsed": time.monotonic() - start, "timed_out": False,
                            "out": base64.b64encode(out).decode(), "err": base64.b64encode(err).decode(),
                            "out_dropped": 0, "err_dropped": 0, "procs_left": 0, "oom_kills": -1,
                            "fetch_stream": False}).encode())
    write_frame(b'{"clean": true, "unclean": ""}')
"""


def _naive_pool():
    """A warm pool without hygiene: the same bwrap sandbox and cgroup slot, but its pid 1 runs every
    job in one interpreter (NAIVE_MAIN) and neither it nor the host cleans anything."""
    from sandbox.backends.local import LocalBackend
    from sandbox.backends.resident import RUNNER

    class NaivePool(LocalBackend):
        def _runner_command(self, python: str) -> list[str]:
            return [python, "-E", "-s", "-c", RUNNER[:RUNNER.rindex("\nmain()")] + NAIVE_MAIN, ""]

        def _sweep(self, box, run):
            return True, False  # no host-side kill of leftovers either

    return NaivePool(pool_size=1)


@pytest.mark.parametrize("leak", list(WARM_LEAKS))
def test_each_leak_check_fails_on_a_naive_pool(leak):
    """The check above is not vacuous: on a pool that reuses its interpreter and cleans nothing, the
    plant reaches the next run."""
    if "keyring" in leak and KEYCTL is None:
        pytest.skip(f"no keyctl syscall numbers for {os.uname().machine}")
    naive = _naive_pool()
    try:
        assert leak_seen(naive, *WARM_LEAKS[leak], visits=1) != []
    finally:
        naive.close()


def test_bad_file_path_rejected():
    from sandbox.api import RequestError

    with pytest.raises(RequestError, match="outside the writable dirs"):
        parse_run_request({"code": "print(1)", "files": {"../x": ""}})


def test_leak_loop_500_runs_leaves_nothing():
    """500 runs (with timeouts mixed in) on the local backend: the slots hold nothing but their warm
    sandboxes, and after close no process or cgroup remains."""
    from sandbox.backends.local import LocalBackend

    backend = _make_local()
    marker = f"sgrpo-loop-{uuid.uuid4().hex}"
    code = f"import sys\nprint(sys.argv[0], {marker!r})"
    with ThreadPoolExecutor(POOL) as pool:
        results = list(pool.map(lambda i: run(backend, code if i % 100 else "while True: pass",
                                              run_timeout=1 if i % 100 == 0 else 10), range(500)))
    assert sum(r.outcome is FINISHED for r in results) == 495
    assert sum(r.outcome is TIMEOUT for r in results) == 5
    sandboxes = {pid for box in backend._boxes for pid in box.keep}  # each slot's bwrap and runner
    assert len(sandboxes) == 2 * POOL and {p for slot in backend.pool.slots for p in slot.pids()} == sandboxes
    parents = list(backend.pool.parents.values())
    backend.close()
    assert [p for p in parents if os.path.exists(p)] == []
    assert isinstance(backend, LocalBackend) and marked_processes(marker) == []


def test_cgroups_of_a_killed_service_are_swept_at_the_next_start():
    """A service SIGKILLed mid-run leaves its slot cgroups; the next one to start removes them.
    Its sandboxes do not outlive it (bwrap's --die-with-parent); ended, they are orphans, reaped
    here where this process adopts them (a child subreaper while a backend of it is open), not left as
    zombies below the test process for the rest of the session."""
    import subprocess
    import sys
    import time

    from openrlhf_sgrpo.demo.memory import descendants

    script = ("import threading, time\nfrom sandbox.backends.local import LocalBackend\n"
              "from sandbox.api import parse_run_request\nb = LocalBackend(pool_size=2)\n"
              "threading.Thread(target=b.run, args=(parse_run_request({'code': 'import time; time.sleep(60)'}), 64),"
              " daemon=True).start()\nprint('up', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        mine = f"sgrpo-sandbox-{proc.pid}"
        time.sleep(1)  # let the run start inside a slot
        sandboxes = descendants(proc.pid)
        assert "bwrap" in live_names(sandboxes), sandboxes
        proc.kill()
        proc.wait(timeout=30)
        assert reap_adopted(sandboxes) == []
        assert any(p.endswith(mine) for p in leftover_cgroups()), "the killed service left no cgroups to sweep"
        fresh = _make_local()
        try:
            assert not any(p.endswith(mine) for p in leftover_cgroups())
            assert run(fresh, "print('ok')").stdout == "ok\n"
        finally:
            fresh.close()
    finally:
        proc.kill()


SUBREAPER_SPAN = """
import ctypes, json
from sandbox.backends.local import LocalBackend
from sandbox.reaper import is_subreaper
seen = [is_subreaper()]
a, b = LocalBackend(pool_size=1), LocalBackend(pool_size=1)
seen.append(is_subreaper())
a.close()
seen.append(is_subreaper())
b.close()
seen.append(is_subreaper())
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # a subreaper of its own accord stays one
c = LocalBackend(pool_size=1)
c.close()
seen.append(is_subreaper())
print(json.dumps(seen))
"""


def test_the_process_is_a_subreaper_only_while_a_backend_is_open():
    """The flag is the process's: while any local backend is open, orphans below come here to be
    reaped; after the last one closes they go where they went before, so a process that embedded
    a backend for a while (a test worker: Ray workers, sandboxes of killed services, browser
    children were left as its zombies for the rest of the session) adopts nothing more."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SUBREAPER_SPAN], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == [False, True, True, False, True]


NON_REAPING_PARENT = """
import ctypes, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans below come here...
sys.exit(subprocess.call(sys.argv[1:]))  # ...and are never reaped, like a container's bare pid 1
"""


@pytest.mark.slow
def test_replaced_sandboxes_survive_a_pid_1_that_never_reaps():
    """More sandbox replacements on one slot than `pids.max` allows zombies, under an ancestor that
    never reaps.

    When the service's own deadline ends a run (the runner did not answer by then: forced here by a
    deadline before the runner's), the service kills the sandbox, bwrap's monitor with its runner,
    and the runner is orphaned. Without the service reaping it (a child subreaper), each one stays a
    zombie charged to the slot, and after ~64 of them the next sandbox cannot fork. Every run is
    checked (a time-out, with no output: the runner that held it is gone), and so is that orphans
    really came and that the slot holds only its live sandbox at the end.
    """
    import json
    import subprocess
    import sys

    from sandbox.backends.local import PIDS_MAX

    runs = PIDS_MAX + 16
    script = ("import collections, json\nimport sandbox.backends.resident as resident\n"
              "from sandbox.backends.local import LocalBackend\n"
              "from sandbox.api import parse_run_request\nresident.GRACE_S = -0.2\n"
              "b = LocalBackend(pool_size=1)\n"
              "req = parse_run_request({'code': 'print(7, flush=True)\\nwhile True: pass', 'run_timeout': 1})\n"
              f"rs = [b.run(req, 64) for _ in range({runs})]\n"
              "rs.append(b.run(parse_run_request({'code': 'print(8)'}), 64))\n"
              "print(json.dumps([collections.Counter((r.outcome.value, r.stdout, r.sandbox_error) for r in rs).most_common(),"
              " b.reaper.reaped, b.replaced, len(b.pool.slots[0].pids())]))\nb.close()\n")
    out = subprocess.run([sys.executable, "-c", NON_REAPING_PARENT, sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    outcomes, reaped, replaced, slot_pids = json.loads(out.stdout.strip().splitlines()[-1])
    assert outcomes == [[["timeout", "", None], runs], [["finished", "8\n", None], 1]]
    assert reaped > 0 and replaced == runs and slot_pids == 2


@pytest.mark.docker
def test_docker_leak_loop_and_healing():
    """500 warm-pool runs, a container killed from outside (the pool heals), then zero containers."""
    backend = _make_docker()
    try:
        victim = backend._free.queue[0].handle
        victim.kill()
        with ThreadPoolExecutor(POOL) as pool:
            results = list(pool.map(lambda i: run(backend, "print(1)"), range(500)))
        assert all(r.stdout == "1\n" for r in results), [r for r in results if r.stdout != "1\n"][:3]
        assert backend.replaced >= 1
        assert len(backend.live_containers()) == POOL
    finally:
        backend.close()
    from sandbox.backends.docker_pool import LABEL, docker_client

    client = docker_client()
    try:
        assert client.api.containers(all=True, filters={"label": f"{LABEL}={backend.service_id}"}) == []
    finally:
        client.close()


@pytest.mark.docker
def test_close_waits_out_a_removal_already_under_way():
    """Another client removing the pool's containers as it closes (an operator's ``docker rm -f``;
    the engine's own auto-remove of a container whose runner just ended, as in CI) makes close's
    remove answer 409 "removal in progress" at once: close still returns only when the engine
    lists none of them (the old close left some "removing" in about half the tries here)."""
    import contextlib
    import threading

    from docker.errors import APIError, NotFound

    from sandbox.backends.docker_pool import LABEL, docker_client

    client = docker_client()

    def remove(cid: str) -> None:
        with contextlib.suppress(NotFound, APIError):  # close's own remove may come first
            client.api.remove_container(cid, force=True)

    try:
        left = []
        for _ in range(6):
            backend = _docker_backend()
            removers = [threading.Thread(target=remove, args=(cid,)) for cid in backend.live_containers()]
            for remover in removers:
                remover.start()
            backend.close()
            left += client.api.containers(all=True, filters={"label": f"{LABEL}={backend.service_id}"})
            for remover in removers:
                remover.join()
        assert [c["State"] for c in left] == []
    finally:
        client.close()


@pytest.mark.docker
def test_resident_container_killed_mid_run_is_reported_and_healed():
    """A container that dies during a run yields a SandboxError result (no hang), then a fresh one."""
    import threading
    import time

    backend = _docker_backend(pool_size=1)
    try:
        victim = backend._free.queue[0].handle
        marker = f"sgrpo-victim-{uuid.uuid4().hex}"
        box: list = []
        code = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', {marker!r}])"
        worker = threading.Thread(target=lambda: box.append(run(backend, code, run_timeout=40)))
        worker.start()
        deadline = time.monotonic() + 30
        while not marked_processes(marker):  # the run is under way
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        victim.kill()
        worker.join(timeout=60)
        assert box, "the run hung after its container died"
        lost = box[0]
        assert lost.outcome is Outcome.SANDBOX_ERROR and "lost during the run" in lost.sandbox_error
        assert run(backend, "print('healed')").stdout == "healed\n"
        assert backend.replaced == 1
    finally:
        backend.close()


@pytest.mark.docker
def test_pool_containers_vanish_when_the_service_is_killed():
    """SIGKILL the service: each pid 1 sees its stdin close, exits, and auto_remove deletes it."""
    import subprocess
    import sys
    import time

    from sandbox.backends.docker_pool import DEFAULT_IMAGE, LABEL, connect

    try:
        client = connect(DEFAULT_IMAGE)
    except EnvironmentMissing as err:  # same skip rule as the suite's fixture
        pytest.skip(str(err))
    script = ("import sys, time\nfrom sandbox.backends.docker_pool import DockerBackend\n"
              "b = DockerBackend(pool_size=2)\nprint(b.service_id, flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        service_id = proc.stdout.readline().strip()
        assert service_id, "the backend did not start"
        label = {"label": f"{LABEL}={service_id}"}
        # the low-level list: the high-level one inspects each id and races the removal we wait for
        assert len(client.api.containers(all=True, filters=label)) == 2
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while client.api.containers(all=True, filters=label):
            assert time.monotonic() < deadline, "containers outlived their killed service"
            time.sleep(0.5)
    finally:
        proc.kill()
        client.close()


@pytest.mark.docker
def test_resident_runner_enforces_the_deadline_itself():
    """The runner kills the run and every heir at `timeout` and says so out of band (`timed_out`)."""
    import time

    from sandbox.backends.resident import job_for

    backend = _docker_backend(pool_size=1)
    try:
        box = backend._free.get()
        request = parse_run_request({"code": "import os, time\nif os.fork() == 0:\n    os.setsid()\ntime.sleep(30)",
                                     "run_timeout": 1})
        start = time.monotonic()
        reply = box.channel.call(job_for(request, 64), b"", start + 30)
        assert reply["timed_out"] and reply["procs_left"] == 0, reply
        assert time.monotonic() - start < 10
        backend._free.put(box)
        assert run(backend, "print('after')").stdout == "after\n"  # the same runner goes on
        assert backend.replaced == 0
    finally:
        backend.close()
