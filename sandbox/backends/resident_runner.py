"""Resident job runner: pid 1 of every warm sandbox, a local bubblewrap sandbox or a Docker container.

Why: setting a sandbox up (bwrap's namespaces, mounts and cgroup; a container) costs more than
running `print(1)` in it, and a `docker exec` costs ~100 ms of runc work on its own. So a warm
sandbox keeps this runner as its pid 1, and the runner starts each run itself: it writes the code
and files, and `posix_spawn`s `python3 -E -s main.py` in /work, a fresh process and interpreter
per run, the very command on both backends, so a program sees the same argv, paths and
tracebacks. Being the program's parent, it sees its wait status, so a death by signal N reads -N
(as in SandboxFusion), never the 128 + N that bwrap's monitor or an exec's exit code would fold it
into. It enforces the run's deadline itself (it kills every other process at `timeout`), so a
time-out is the runner's own fact, never read from the program's exit status.

Nothing a run does may reach the next one. After every run, off the next run's critical path, the
runner kills every other process, empties the scratch dirs, removes SysV and POSIX IPC objects and
keys, and puts back what a program of its uid could change in pid 1 itself (rlimits through
prlimit, the CPU affinity) or on the scratch roots (mode, times, xattrs). Then it compares the
sandbox with the snapshot it took at start, before any code ran: processes, scratch contents and
roots, IPC objects, keyrings, TCP sockets (a TIME_WAIT socket keeps a port from being bound again
for a minute) and its own rlimits, scheduling and I/O priority. If anything differs, it refuses
the next job ("unclean"), and the host replaces the sandbox; the job goes to another one.

It runs INSIDE the sandbox, as the same unprivileged uid as the code, from `python3 -c` source
(stdlib only: the Docker image is python3-minimal). The code cannot touch it: it is pid 1 with no
signal handlers (it drops Python's SIGINT handler), so signals from inside the pid namespace are
dropped, and it marks itself non-dumpable, so ptrace, /proc/1/{fd,mem} and /proc/1's writable
files are refused. What the kernel lets a same-uid process change without ptrace (prlimit,
setpriority, sched_setaffinity, ioprio_set) is covered by the snapshot above.

Protocol on its stdin/stdout (frames are >I length + bytes):
  in:  JSON {"timeout": s, "cap": bytes per stream, "fetch": [names], "fetch_cap": bytes,
       "code": str, "files": {absolute path: base64}}, then the run's stdin
  out: {"ready": true, "oom_kills"} once at start; per job {"accepted": true} (the code is about
       to run: the host must not resend the job) or {"accepted": false, "unclean": why}, then
       JSON {"rc" (-N for a death by signal N), "elapsed", "timed_out", "out", "err" (base64 of
       the kept bytes), "out_dropped", "err_dropped", "procs_left", "oom_kills", "fetch_stream"}
       or {"setup_error": why} if the files could not be written; with "fetch_stream" true, the
       fetch collector's JSON answer follows in frames, ended by an empty frame; last, once the
       sandbox is wiped, {"clean": bool, "unclean": why or ""}: the host sends no job (nor
       changes the memory limit, which the last run's files may still exceed) before it
"""

import base64
import ctypes
import json
import os
import resource
import select
import signal
import struct
import sys
import time

FETCH = sys.argv[1]  # the fetch collector's source (sandbox/fetch_collector.py, from the host)
OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")
FETCH_DEADLINE_S = 30
PROGRAM = ["/usr/bin/python3", "-E", "-s", "main.py"]  # in /work, on every backend
SCRIPT = "/work/main.py"
# What a run can leave behind: files in these dirs (POSIX message queues are files in /dev/mqueue)
# and SysV IPC objects, which outlive every process of the sandbox's IPC namespace.
SCRATCH = ("/work", "/tmp", "/dev/shm", "/dev/mqueue")
SOCKSTAT = ("/proc/net/sockstat", "/proc/net/sockstat6")  # this network namespace's socket counts
IPC_RMID = 0
LIBC = ctypes.CDLL(None, use_errno=True)
# Syscalls the C library does not wrap, by machine (elsewhere those checks are skipped).
SYSCALLS = {"x86_64": {"keyctl": 250, "ioprio_get": 252, "sched_getattr": 315},
            "aarch64": {"keyctl": 219, "ioprio_get": 31, "sched_getattr": 275}}.get(os.uname().machine, {})
KEYCTL_DESCRIBE, KEYCTL_CLEAR, KEYCTL_LINK, KEYCTL_READ = 6, 7, 8, 11
USER_KEYRING, USER_SESSION_KEYRING = -4, -5  # per uid and user namespace: they outlive every run
RLIMITS = sorted(getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_"))


def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            sys.exit(0)  # the host hung up: the sandbox ends (a container is removed)
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


def others():
    return [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]


def kill_all_others():
    """SIGKILL every process but pid 1 until none is left, reaping as they die; return survivors."""
    for _ in range(200):
        try:
            os.kill(-1, 9)
        except ProcessLookupError:
            pass
        reap_all(0)
        left = others()
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
    this sandbox's memory as tmpfs pages: no copy of them is held here), then an empty frame."""
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


# ---- what a run could leave behind: a snapshot, a wipe, a comparison ---------------------------
def syscall(name, *args):
    """(result, errno) of a raw syscall; (None, 0) on a machine without a number for it."""
    number = SYSCALLS.get(name)
    if number is None:
        return None, 0
    result = LIBC.syscall(number, *args)
    return result, ctypes.get_errno() if result < 0 else 0


def keyring_state(keyring):
    """A keyring's description (owner, permissions) and the ids linked in it, or the error that
    keeps them from this process (seccomp's EPERM under Docker's default profile: no keys at all)."""
    desc = ctypes.create_string_buffer(256)
    size, err = syscall("keyctl", KEYCTL_DESCRIBE, keyring, desc, len(desc))
    if size is None or size < 0:
        return ("error", err)
    links = ctypes.create_string_buffer(4096)
    count, err = syscall("keyctl", KEYCTL_READ, keyring, links, len(links))
    if count < 0:
        return ("error", err)
    return (desc.raw[:size], links.raw[:min(count, len(links))])


def own_state():
    """What a same-uid program can change in pid 1 without ptrace, and every later run inherits."""
    sched = ctypes.create_string_buffer(56)  # struct sched_attr: policy, nice, priority, util clamps
    got, _ = syscall("sched_getattr", 0, sched, len(sched), 0)
    return {"rlimits": [resource.getrlimit(r) for r in RLIMITS], "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "affinity": sorted(os.sched_getaffinity(0)), "sched": sched.raw if got == 0 else got,
            "ioprio": syscall("ioprio_get", 1, 0)[0]}  # IOPRIO_WHO_PROCESS, self


def root_state(path):
    """A scratch root's own metadata that a run could set and a wipe of its contents would not reset.

    Its times count only when the sandbox user owns it (bwrap's tmpfs): a root owned by another
    uid (Docker's mode-1777 tmpfs) takes no chosen time, mode or user xattr from a run; creating
    and removing entries there only moves its mtime to "now"."""
    try:
        st = os.stat(path)
    except FileNotFoundError:  # an engine without /dev/mqueue
        return None
    try:
        xattrs = sorted(os.listxattr(path))
    except OSError:
        xattrs = []
    return (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns if st.st_uid == os.getuid() else None, xattrs)


def snapshot():
    """The sandbox's state, taken at start before any code ran: what every run must find again."""
    return {"own": own_state(), "roots": {p: root_state(p) for p in SCRATCH},
            "keys": [keyring_state(k) for k in (USER_KEYRING, USER_SESSION_KEYRING)]}


def tcp_left():
    """TCP sockets left in this network namespace once its processes are gone: closing orphans
    ("inuse", v4 and v6) and TIME_WAIT ("tw", both families). From the namespace's counters: the
    per-socket tables (/proc/net/tcp) walk the host's whole connection hash, ~5 ms a read."""
    left = 0
    for path in SOCKSTAT:
        try:
            with open(path, "rb") as fh:
                lines = fh.read().decode().splitlines()
        except OSError:
            continue
        for line in lines:
            proto, _, fields = line.partition(": ")
            if proto in ("TCP", "TCP6"):
                values = fields.split()
                counts = dict(zip(values[::2], values[1::2]))
                left += int(counts.get("inuse", 0)) + int(counts.get("tw", 0))
    return left


def dirt(clean):
    """Why the sandbox differs from `clean`, its state at start, or "" if it does not."""
    left = others()
    if left:
        return f"{len(left)} processes besides pid 1"
    for path in SCRATCH:
        try:
            if os.listdir(path):
                return f"{path} is not empty"
        except FileNotFoundError:
            pass
    for kind in ("shm", "sem", "msg"):
        try:
            with open(f"/proc/sysvipc/{kind}") as fh:
                if len(fh.read().splitlines()) > 1:
                    return f"SysV {kind} objects left"
        except OSError:
            pass
    if tcp_left():
        return "TCP sockets left (a closed connection in TIME_WAIT holds its port)"
    now = snapshot()
    for key, why in (("roots", "a scratch root's mode, times or xattrs changed"),
                     ("keys", "keys left in the user keyrings"),
                     ("own", "pid 1's rlimits, scheduling, CPU affinity or I/O priority changed")):
        if now[key] != clean[key]:
            return why
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


def reset_root(path, clean):
    """Give a scratch root back the mode, times and xattrs it had at start."""
    mode, uid, _, mtime_ns, xattrs = clean
    if uid != os.getuid():
        return
    os.chmod(path, mode & 0o7777)
    for name in os.listxattr(path):
        if name not in xattrs:
            os.removexattr(path, name)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def remove_sysv_objects():
    for kind, remove in (("shm", lambda i: LIBC.shmctl(i, IPC_RMID, None)),
                         ("sem", lambda i: LIBC.semctl(i, 0, IPC_RMID)),
                         ("msg", lambda i: LIBC.msgctl(i, IPC_RMID, None))):
        with open(f"/proc/sysvipc/{kind}") as fh:
            for line in fh.read().splitlines()[1:]:
                remove(int(line.split()[1]))


def reset_keyrings():
    """Empty both user keyrings; the user session keyring links the user keyring, as at start."""
    for keyring in (USER_KEYRING, USER_SESSION_KEYRING):
        syscall("keyctl", KEYCTL_CLEAR, keyring)
    syscall("keyctl", KEYCTL_LINK, USER_KEYRING, USER_SESSION_KEYRING)


def reset_own(clean):
    """Raise soft rlimits lowered by prlimit back (a lowered hard limit or a raised nice value
    cannot come back: `dirt` then retires the sandbox) and restore the CPU affinity."""
    for res, (soft, hard) in zip(RLIMITS, clean["rlimits"]):
        if resource.getrlimit(res) != (soft, hard):
            try:
                resource.setrlimit(res, (soft, hard))
            except (OSError, ValueError):
                pass
    try:
        os.sched_setaffinity(0, clean["affinity"])
    except OSError:
        pass


def wipe(clean):
    """Put the sandbox back as `clean` found it, as far as the sandbox user can; `dirt` says the rest."""
    for path in SCRATCH:
        try:
            empty_dir(path)
            reset_root(path, clean["roots"][path])
        except (OSError, TypeError):
            pass
    try:
        remove_sysv_objects()
    except OSError:
        pass
    if clean["keys"][0][0] != "error":
        reset_keyrings()
    reset_own(clean["own"])


# ---- one run --------------------------------------------------------------------------------------
def make_parents(path):
    """`os.makedirs` of a file's parents without recursion: a request's path may be 2,000 dirs deep."""
    current = ""
    for part in path.split("/")[1:-1]:
        current += "/" + part
        try:
            os.mkdir(current)
        except FileExistsError:
            pass


def write_files(code, files):
    """The run's code as /work/main.py and its files (paths validated by the host); an error or None."""
    try:
        for path, data in files.items():
            make_parents(path)
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
    clean = snapshot()
    unclean = dirt(clean)
    write_frame(json.dumps({"ready": True, "oom_kills": oom_kills()}).encode())
    while True:
        job, payload = json.loads(read_frame()), read_frame()
        if unclean:  # a run's leftovers survived its wipe: this sandbox must not run code again
            write_frame(json.dumps({"accepted": False, "unclean": unclean}).encode())
            continue
        write_frame(b'{"accepted": true}')  # from here on the code runs: the host must not resend it
        reply = run_job(job, payload, chld)
        write_frame(json.dumps(reply).encode())
        if reply.get("fetch_stream"):
            forward_fetch(start_fetch(job["fetch"], int(job["fetch_cap"])), 2 * int(job["fetch_cap"]))
        del job, payload
        wipe(clean)  # after the reply, off the run's critical path
        unclean = dirt(clean)
        write_frame(json.dumps({"clean": not unclean, "unclean": unclean}).encode())


main()
