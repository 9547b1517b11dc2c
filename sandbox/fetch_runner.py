"""Collect the files a run left behind (SandboxFusion's `fetch_files`), from INSIDE the sandbox.

It runs as the sandbox's user, in a fresh process after the program has ended, so it reads what
the program itself could read and nothing more: a symlink to another process's memory is refused
to it as it would be to the program. A FIFO or device under a fetched name is skipped, never
opened for a blocking read. stdlib only, shipped as `python3 -I -S -c` source (see sandbox/fetch.py).

  fetch CAP NAME...                  the JSON below on stdout
  run FD CAP NAME... -- PROG ARG...  run PROG (which never sees FD), then the JSON on FD; exit as PROG did
JSON: {"files": {name: base64 content}, "omitted": [names of regular files past CAP bytes in total]}
Names are taken as SandboxFusion takes them: relative to the cwd (/work), or absolute.
"""

import base64
import json
import os
import signal
import stat
import sys


def read_regular(name, room):
    """(bytes or None if not a readable regular file, over_room?)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None, False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, False
        chunks, size = [], 0
        while size <= room:
            chunk = os.read(fd, min(1 << 20, room + 1 - size))
            if not chunk:
                return b"".join(chunks), False
            chunks.append(chunk)
            size += len(chunk)
        return None, True
    except OSError:
        return None, False
    finally:
        os.close(fd)


def collect(cap, names):
    files, omitted, total = {}, [], 0
    for name in names:
        data, over = read_regular(name, cap - total)
        if over:
            omitted.append(name)
        elif data is not None:
            files[name] = base64.b64encode(data).decode()
            total += len(data)
    return json.dumps({"files": files, "omitted": omitted})


def run_then_collect(out_fd, cap, names, prog):
    pid = os.fork()
    if pid == 0:
        try:
            os.close(out_fd)
            os.execv(prog[0], prog)
        finally:
            os._exit(127)
    status = os.waitpid(pid, 0)[1]
    with os.fdopen(out_fd, "w") as out:
        out.write(collect(cap, names))
    if os.WIFSIGNALED(status):  # end the same way, so the sandbox reports what it would have
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    return os.waitstatus_to_exitcode(status) & 0xFF


def main(argv):
    if argv[0] == "fetch":
        sys.stdout.write(collect(int(argv[1]), argv[2:]))
        return 0
    split = argv.index("--")
    return run_then_collect(int(argv[1]), int(argv[2]), argv[3:split], argv[split + 1:])


sys.exit(main(sys.argv[1:]))
