"""Drive a child's stdin/stdout/stderr (and side pipes) with one selector loop and a hard deadline.

One loop instead of `communicate()` because we need both a byte cap on the output (a flood must
not fill memory) and a wall-clock deadline after which the caller kills the whole cgroup. Side
pipes (e.g. the fetched-files answer) are drained in the same loop, so a writer never blocks on
a full pipe while we wait for stdout to close.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from dataclasses import dataclass, field

from ..output import CappedBuffer

_CHUNK = 65536


@dataclass
class PumpResult:
    stdout: str
    stderr: str
    timed_out: bool
    side: dict[int, bytes] = field(default_factory=dict)  # what each side pipe carried, up to its cap


def pump(proc: subprocess.Popen, stdin: bytes, deadline: float, max_output_bytes: int,
         side_caps: dict[int, int] | None = None) -> PumpResult:
    """Feed stdin, collect capped output until every pipe closes or `deadline` (monotonic) passes.

    `side_caps` maps the read end of a side pipe (owned by the caller) to the bytes kept from it.
    """
    out, err = CappedBuffer(max_output_bytes), CappedBuffer(max_output_bytes)
    side = {fd: CappedBuffer(cap) for fd, cap in (side_caps or {}).items()}
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    for fd, buf in side.items():
        sel.register(fd, selectors.EVENT_READ, buf)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, None)
    else:
        proc.stdin.close()
    timed_out = False
    try:
        while len(sel.get_map()) > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=remaining):
                if key.data is None:  # stdin writable
                    try:
                        pending = pending[os.write(key.fd, pending[:_CHUNK]):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the program stopped reading: drop the rest
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(key.fileobj)
                        proc.stdin.close()
                    continue
                data = os.read(key.fd, _CHUNK)
                if data:
                    key.data.write(data)
                else:
                    sel.unregister(key.fileobj)
    finally:
        sel.close()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe and not pipe.closed:
                pipe.close()
    return PumpResult(out.text(), err.text(), timed_out, {fd: buf.kept() for fd, buf in side.items()})
