"""Resident job runner: pid 1 of every pooled Docker sandbox container.

Why: a `docker exec` costs ~100 ms of runc work on its own, so a per-run exec can never be much
faster than a cold container. This runner stays in the container and starts each run itself:
it proves the container clean (no process but itself, empty scratch dirs, no SysV IPC object),
writes the code and files, and `posix_spawn`s `python3 -E -s main.py` in /work, the very command
the local backend runs, so a program prints the same tracebacks on both. Being the program's
parent, it sees its wait status, so a death by signal N reads -N (as in SandboxFusion), never
the 128 + N that an exec's exit code would fold it into. It enforces the run's deadline itself
(it kills every other process at `timeout`), so a time-out is the runner's own fact, never read
from the program's exit status. After replying it wipes the scratch dirs and SysV IPC objects,
off the next run's critical path.

It runs INSIDE the container, as the same unprivileged uid as the code, from `python3 -c` source
(stdlib only: the image is python3-minimal). The code cannot touch it: it is pid 1 with no signal
handlers (it drops Python's SIGINT handler), so signals from inside the pid namespace are dropped,
and it marks itself non-dumpable, so ptrace and /proc/1/{fd,mem} are refused. After each run it
SIGKILLs every other process (kill(-1) from pid 1 spares only itself) and reaps them, so nothing
outlives a run.

Protocol on its stdin/stdout, the container's attached streams (frames are >I length + bytes):
  in:  JSON {"timeout": s, "cap": bytes per stream, "fetch": [names], "fetch_cap": bytes,
       "code": str, "files": {absolute path: base64}}, then the run's stdin
  out: {"ready": true, "oom_kills"} once at start; per job {"accepted": true} (the code is about
       to run: the host must not resend the job) or {"accepted": false, "unclean": why}, then
       JSON {"rc" (-N for a death by signal N), "elapsed", "timed_out", "out", "err" (base64 of
       the kept bytes), "out_dropped", "err_dropped", "procs_left", "oom_kills", "fetch_stream"}
       or {"setup_error": why} if the files could not be written; with "fetch_stream" true, the
       fetch collector's JSON answer follows in frames, ended by an empty frame
"""

import base64
import ctypes
import json
import os
import select
import signal
import struct
import sys
import time

FETCH = sys.argv[1]  # the fetch collector's source (sandbox/sandbox_init.py, from the host)
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
FETCH_DEADLINE_S = 30
PROGRAM = ["/usr/bin/python3", "-E", "-s", "main.py"]  # as the local backend runs it, in /work
SCRIPT = "/work/main.py"
# What a run can leave behind: files in these dirs (POSIX message queues are files in /dev/mqueue)
# and SysV IPC objects, which outlive every process of the container's IPC namespace.
SCRATCH = ("/work", "/tmp", "/dev/shm", "/dev/mqueue")
IPC_RMID = 0
LIBC = ctypes.CDLL(None, use_errno=True)


def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            sys.exit(0)  # the host hung up: the container ends and is removed
        buf += chunk
    return buf


def read_frame():
    return read_exact(struct.unpack(">I", read_exact(4))[0])


def write_frame(data):
    frame = struct.pack(">I", len(data)) + data
    while frame:
        frame = frame[os.write(1, frame):]


def oom_kills():
    for path in OOM_FILES:
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            pass
    return -1


def kill_all_others():
    """SIGKILL every process but pid 1 until none is left, reaping as they die; return survivors."""
    for _ in range(200):
        try:
            os.kill(-1, 9)
        except ProcessLookupError:
            pass
        reap_all(0)
        left = [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]
        if not left:
            return 0
        time.sleep(0.005)
    return len(left)


def reap_all(pid):
    """Reap every exited child (orphans come to pid 1); the wait status of `pid` if it was among them."""
    found = None
    while True:
        try:
            child, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if child == 0:
            return found
        if child == pid:
            found = status


def sigchld_fd():
    """A signalfd that turns readable when a child exits, SIGCHLD being blocked: pid 1 wakes to
    reap orphans at once (zombies count against pids.max) without a handler that would let the
    code's signals in."""
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    mask = (ctypes.c_uint64 * 16)()  # a sigset_t
    mask[0] = 1 << (signal.SIGCHLD - 1)
    fd = LIBC.signalfd(-1, ctypes.byref(mask), os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "signalfd")
    return fd


def drain(fd):
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def spawn(argv, stdin, stdout, stderr):
    return os.posix_spawn(argv[0], argv, os.environ,
                          file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, stdout, 1),
                                        (os.POSIX_SPAWN_DUP2, stderr, 2)],
                          setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # Python ignores these; the run must not
                          setsigmask=())  # nor inherit the blocked SIGCHLD


def start_fetch(names, cap):
    """Start the fetch collector, a fresh process after the program; the read end of its answer."""
    out_r, out_w = os.pipe()
    null = os.open("/dev/null", os.O_RDWR)
    spawn(["/usr/bin/python3", "-I", "-S", "-c", FETCH, "fetch", str(cap), *names], null, out_w, null)
    os.close(out_w)
    os.close(null)
    return out_r


def forward_fetch(fd, limit):
    """Pass the collector's answer on as frames, a piece at a time (the fetched files already sit in
    this container's memory as tmpfs pages: no copy of them is held here), then an empty frame."""
    sent, deadline = 0, time.monotonic() + FETCH_DEADLINE_S
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while sent <= limit and poller.poll(max(deadline - time.monotonic(), 0) * 1000):
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        write_frame(chunk)
        sent += len(chunk)
    write_frame(b"")
    os.close(fd)
    kill_all_others()


def dirt():
    """Why the container is not clean for a run, or "" (nothing but pid 1, empty scratch, no SysV IPC)."""
    others = [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]
    if others:
        return f"{len(others)} processes besides pid 1"
    for path in SCRATCH:
        try:
            if os.listdir(path):
                return f"{path} is not empty"
        except FileNotFoundError:  # an engine without /dev/mqueue
            pass
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                if len(fh.read().splitlines()) > 1:
                    return f"SysV {kind} objects left"
        except OSError:
            pass
    return ""


def empty_dir(top):
    """Remove everything below `top`, however deep (no recursion) and whatever its modes: the
    sandbox user owns all of it, so it may chmod its way in."""
    stack, dirs = [top], []
    while stack:
        path = stack.pop()
        if path != top:
            os.chmod(path, 0o700)
            dirs.append(path)
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            else:
                os.unlink(entry.path)
    for path in reversed(dirs):
        os.rmdir(path)


def remove_sysv_objects():
    for kind, remove in (("shm", lambda i: LIBC.shmctl(i, IPC_RMID, None)),
                         ("sem", lambda i: LIBC.semctl(i, 0, IPC_RMID)),
                         ("msg", lambda i: LIBC.msgctl(i, IPC_RMID, None))):
        with open(f"/proc/sysvipc/{kind}") as fh:
            for line in fh.read().splitlines()[1:]:
                remove(int(line.split()[1]))


def wipe():
    """Empty the scratch dirs (POSIX message queues included) and remove SysV IPC objects, all of
    them the sandbox user's; what stays is caught by `dirt` before the next run."""
    for path in SCRATCH:
        try:
            empty_dir(path)
        except OSError:
            pass
    try:
        remove_sysv_objects()
    except OSError:
        pass


def write_files(code, files):
    """The run's code as /work/main.py and its files (paths validated by the host); an error or None."""
    try:
        for path, data in files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(base64.b64decode(data))
        with open(SCRIPT, "wb") as fh:
            fh.write(code.encode())
    except (OSError, ValueError) as err:
        return f"could not write the run's files: {err}"
    return None


def run_job(job, payload, chld):
    setup_error = write_files(job.pop("code"), job.pop("files"))  # popped: freed before the program runs
    if setup_error:
        return {"setup_error": setup_error}
    cap = int(job["cap"])
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = spawn(PROGRAM, in_r, out_w, err_w)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    kept = {out_r: b"", err_r: b""}
    dropped = {out_r: 0, err_r: 0}
    poller = select.poll()
    for fd in (out_r, err_r, chld):
        poller.register(fd, select.POLLIN)
    os.set_blocking(in_w, False)
    poller.register(in_w, select.POLLOUT)
    pending, open_fds, rc, timed_out = payload, {out_r, err_r, in_w}, None, False
    deadline = start + float(job["timeout"])
    while (rc is None and not timed_out) or open_fds - {in_w}:
        remaining = deadline - time.monotonic()
        if remaining <= 0 and rc is None and not timed_out:
            timed_out = True  # the run's time is up: kill the lot (the program's status is moot)
            kill_all_others()
        events = poller.poll(max(remaining, 0) * 1000 if rc is None and not timed_out else 1000)
        if not events and (rc is not None or timed_out):
            break  # the program is gone and its heirs were killed: nothing more can arrive
        for fd, ev in events:
            if fd == chld:
                drain(chld)
                status = reap_all(pid)
                if status is not None and rc is None and not timed_out:
                    poller.unregister(chld)
                    rc = os.waitstatus_to_exitcode(status)  # -N for a death by signal N, as asyncio says
                    kill_all_others()  # daemonized heirs die with the run and close the pipes
            elif fd == in_w:
                try:
                    pending = pending[os.write(in_w, pending[:65536]):]
                except BlockingIOError:
                    pass
                except BrokenPipeError:  # the program exited or closed stdin: the rest is moot
                    pending = b""
                if not pending:
                    poller.unregister(in_w)
                    os.close(in_w)
                    open_fds.discard(in_w)
            else:
                chunk = os.read(fd, 65536)
                if not chunk:
                    poller.unregister(fd)
                    os.close(fd)
                    open_fds.discard(fd)
                    continue
                room = cap - len(kept[fd])
                kept[fd] += chunk[:max(room, 0)]
                dropped[fd] += max(0, len(chunk) - max(room, 0))
    elapsed = time.monotonic() - start
    for fd in open_fds:
        os.close(fd)
    drain(chld)
    return {"rc": rc, "elapsed": elapsed, "timed_out": timed_out, "out": base64.b64encode(kept[out_r]).decode(),
            "err": base64.b64encode(kept[err_r]).decode(), "out_dropped": dropped[out_r],
            "err_dropped": dropped[err_r], "procs_left": kill_all_others(), "oom_kills": oom_kills(),
            # after a time-out too, as SandboxFusion does (its run_commands reads fetch_files whatever the status)
            "fetch_stream": bool(job.get("fetch"))}


def main():
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python's handler would let the code's SIGINT in
    LIBC.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    chld = sigchld_fd()
    write_frame(json.dumps({"ready": True, "oom_kills": oom_kills()}).encode())
    while True:
        job, payload = json.loads(read_frame()), read_frame()
        unclean = dirt()
        if unclean:  # a run's leftovers survived its wipe: this container must not run code again
            write_frame(json.dumps({"accepted": False, "unclean": unclean}).encode())
            continue
        write_frame(b'{"accepted": true}')  # from here on the code runs: the host must not resend it
        reply = run_job(job, payload, chld)
        write_frame(json.dumps(reply).encode())
        if reply.get("fetch_stream"):
            forward_fetch(start_fetch(job["fetch"], int(job["fetch_cap"])), 2 * int(job["fetch_cap"]))
        del job, payload
        wipe()  # after the reply: the next job finds the container clean


main()
