"""A naive warm runner, for tests only: what a warm pool is without hygiene.

It speaks sandbox/backends/resident_runner.py's protocol in the same bwrap sandbox and cgroup, but
runs every job with `exec` in its own long-lived interpreter (no fresh process) and cleans nothing
after a run: no kill of leftovers, no wipe, no check before the next job. The isolation suite runs
each cross-run leak check against a pool of these to show that the check can fail.
"""

import base64
import contextlib
import io
import json
import os
import struct
import sys
import time


def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return buf


def read_frame():
    return read_exact(struct.unpack(">I", read_exact(4))[0])


def write_frame(data):
    frame = struct.pack(">I", len(data)) + data
    while frame:
        frame = frame[os.write(1, frame):]


def run(code):
    """(exit status, stdout, stderr) of `code` exec'd in this very interpreter."""
    out, err, rc = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(code, "/work/main.py", "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException as exc:  # noqa: BLE001 - the program's own error, reported as python3 would
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            rc = 1
    return rc, out.getvalue().encode(), err.getvalue().encode()


write_frame(json.dumps({"ready": True, "oom_kills": -1}).encode())
while True:
    job, stdin = json.loads(read_frame()), read_frame()
    write_frame(b'{"accepted": true}')
    for path, data in job["files"].items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(data))
    start = time.monotonic()
    rc, out, err = run(job["code"])
    write_frame(json.dumps({"rc": rc, "elapsed": time.monotonic() - start, "timed_out": False,
                            "out": base64.b64encode(out).decode(), "err": base64.b64encode(err).decode(),
                            "out_dropped": 0, "err_dropped": 0, "procs_left": 0, "oom_kills": -1,
                            "fetch_stream": False}).encode())
    write_frame(b'{"clean": true, "unclean": ""}')  # it never looks
