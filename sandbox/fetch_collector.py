"""The fetch collector: runs INSIDE a sandbox after the program, as the sandbox user, and answers
SandboxFusion's `fetch_files`.

stdlib only, shipped as `python3 -I -S -c` source (see sandbox/fetch.py); the resident runner
(sandbox/backends/resident_runner.py) starts it as a fresh process once the program and its heirs
are gone, a time-out included (SandboxFusion reads fetch_files whatever the run's status).

  fetch CAP NAME...   {"files": {name: base64}, "omitted": [names]} on stdout

The files are read by the sandbox user, so they are what the program itself could read: a FIFO or
device under a fetched name is skipped, never opened for a blocking read, and regular files past
CAP bytes in total are named in "omitted". Names are taken as SandboxFusion takes them: relative to
the cwd (/work), or absolute. The answer is streamed a chunk of a file at a time: the collector
runs in the run's memory cgroup, where the fetched files already sit in tmpfs, so a collector
holding copies of them was killed for memory.
"""

import os
import stat
import sys

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


def main(argv):
    if argv[0] != "fetch":
        print(f"usage: fetch CAP NAME... (got {argv[:1]})", file=sys.stderr)
        return 2
    write_answer(sys.stdout, "{", int(argv[1]), argv[2:])
    return 0


sys.exit(main(sys.argv[1:]))
