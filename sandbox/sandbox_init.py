"""What runs INSIDE a sandbox beside the program: the local backend's pid 1, and the fetch collector.

stdlib only, shipped as `python3 -I -S -c` source (see sandbox/fetch.py), run as the sandbox user.

  init FD TIMEOUT CAP NAME... -- PROG ARG...  pid 1 of a local run (bwrap --as-pid-1): start PROG,
                                 reap every orphan, end the run at TIMEOUT seconds, then report on
                                 FD, which PROG never holds
  fetch CAP NAME...              {"files", "omitted"} on stdout (the Docker runner's collector)

Why an init of our own: bwrap's monitor, like a Docker exec's exit code, folds a death by signal N
into 128 + N, which `exit(128 + N)` also gives. Only the program's parent sees its wait status, so
the parent is this init, and it reports out of band, never through the program's output:
  line 1, before PROG exists: "started"
  line 2, after PROG ended:   {"returncode": N or null, "timed_out": bool, "files": {name: base64},
                              "omitted": [names]}, N being -S for a death by signal S, as
                              SandboxFusion's asyncio runner reports it; or {"spawn_error": "..."}
At TIMEOUT the init SIGKILLs every other process of the namespace and still collects the fetched
files, as SandboxFusion does after a time-out (the service keeps its own, later deadline in case
the init cannot). The program cannot write to FD or stop the init: the init is non-dumpable (no
ptrace, no /proc/1/fd for it), and as pid 1 of the pid namespace without handlers it receives no
signal from inside it (SIGCHLD, which it waits for, is blocked, not handled). When the init exits,
the kernel kills whatever is left.

Fetched files are read after the program ended, by the sandbox user, so they are what the program
itself could read: a FIFO or device under a fetched name is skipped, never opened for a blocking
read, and regular files past CAP bytes in total are named in "omitted". Names are taken as
SandboxFusion takes them: relative to the cwd (/work), or absolute.
"""

import _signal as signal  # the C module: `signal` imports enum, a tenth of a run's cost
import os
import stat
import sys
import time

PR_SET_DUMPABLE = 4


CHUNK = 3 << 18  # bytes read at a time: a multiple of 3, so base64 pieces concatenate


def open_regular(name):
    """A read fd on `name` if it is a regular file, else None (a FIFO is never opened blocking)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def write_base64(out, fd, size):
    """Write at most `size` bytes of `fd` as base64 on `out`, a chunk at a time; the bytes written."""
    import base64

    done, rest = 0, b""
    while done < size:
        chunk = os.read(fd, min(CHUNK, size - done))
        if not chunk:
            break
        done += len(chunk)
        data, cut = rest + chunk, (len(rest) + len(chunk)) // 3 * 3
        out.write(base64.b64encode(data[:cut]).decode())
        rest = data[cut:]
    out.write(base64.b64encode(rest).decode())
    return done


def write_answer(out, head, cap, names):
    """Write `head` (the opening of a JSON object and its first fields), then "files" and "omitted",
    streamed a chunk of a file at a time: the collector runs in the run's memory cgroup, where the
    fetched files already sit in tmpfs, so it must not hold a copy of them."""
    out.write(head + '"files": {')
    if not names:  # the common run: no json/base64 import on its path
        out.write('}, "omitted": []}')
        return
    import json

    omitted, total, sep = [], 0, ""
    for name in names:
        fd = open_regular(name)
        if fd is None:
            continue
        try:
            size = os.fstat(fd).st_size
            if total + size > cap:
                omitted.append(name)
                continue
            out.write(sep + json.dumps(name) + ': "')
            sep = ", "
            try:
                total += write_base64(out, fd, size)
            except OSError:  # a read error midway: the file's bytes so far, still valid base64
                pass
            out.write('"')
        except OSError:
            pass
        finally:
            os.close(fd)
    out.write('}, "omitted": ' + json.dumps(omitted) + "}")


def reap_all(pid):
    """Reap every exited child; the status of `pid` if it was among them."""
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


def kill_all_others():
    """SIGKILL every other process of the pid namespace (kill(-1) from pid 1 spares only itself)."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
        reap_all(0)
        time.sleep(0.001)
    reap_all(0)


def wait_for(pid, deadline):
    """The wait status of `pid`, or None at the deadline; orphans are reaped as they exit."""
    while True:
        status = reap_all(pid)
        if status is not None:
            return status
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        signal.sigtimedwait([signal.SIGCHLD], remaining)


def init(out_fd, timeout, cap, names, prog):
    """Run `prog` as the only child of pid 1 until it ends or `timeout` s pass; report on `out_fd`."""
    start = time.monotonic()
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1 without handlers: signals from inside are dropped
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])  # waited for with sigtimedwait
    os.set_inheritable(out_fd, False)
    import ctypes

    out = os.fdopen(out_fd, "w")
    out.write("started\n")
    out.flush()
    if ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        out.write('{"spawn_error": "prctl(PR_SET_DUMPABLE, 0) failed"}\n')
        return 127
    try:  # Python ignores SIGPIPE and SIGXFSZ; an ignored signal would stay ignored across exec
        pid = os.posix_spawn(prog[0], prog, os.environ, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), setsigmask=())
    except OSError as err:
        import json

        out.write(json.dumps({"spawn_error": str(err)}) + "\n")
        return 127
    status = wait_for(pid, start + timeout)
    if status is None:
        kill_all_others()
    returncode = None if status is None else os.waitstatus_to_exitcode(status)
    head = '{"returncode": %s, "timed_out": %s, ' % ("null" if status is None else returncode,
                                                     "false" if status is not None else "true")
    write_answer(out, head, cap, names)
    out.write("\n")
    out.close()
    if returncode is None:
        return 137
    return returncode if returncode >= 0 else 128 - returncode  # what bwrap's monitor logs


def main(argv):
    if argv[0] == "fetch":
        write_answer(sys.stdout, "{", int(argv[1]), argv[2:])
        return 0
    split = argv.index("--")
    return init(int(argv[1]), float(argv[2]), int(argv[3]), argv[4:split], argv[split + 1:])


sys.exit(main(sys.argv[1:]))
