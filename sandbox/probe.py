"""Start-up probe run *inside* a backend's sandbox, so /health reports what really holds.

The probe listens on host 127.0.0.1 and the sandboxed code tries to reach it; it also tries to
write to / and /work and reads its uid and rlimits. Shared by all backends.
"""

from __future__ import annotations

import json
import socket
from typing import TYPE_CHECKING

from .api import RunRequest

if TYPE_CHECKING:
    from .backends.base import Backend, Guarantees

PROBE_CODE = r"""
import json, os, resource, socket, sys
port = int(sys.stdin.read())
r = {"uid": os.getuid()}
try:
    open("/probe-root-write", "w"); r["readonly_root"] = False
except OSError:
    r["readonly_root"] = True
try:
    open("/work/probe", "w").write("x"); r["workdir_writable"] = True
except OSError:
    r["workdir_writable"] = False
try:
    socket.create_connection(("127.0.0.1", port), timeout=1); r["no_network"] = False
except OSError:
    r["no_network"] = True
lim = lambda res: resource.getrlimit(res)[1] != resource.RLIM_INFINITY
r["rlimits"] = lim(resource.RLIMIT_NOFILE) and lim(resource.RLIMIT_FSIZE) and resource.getrlimit(resource.RLIMIT_CORE)[1] == 0
print(json.dumps(r))
"""
PROBED = ("no_network", "readonly_root", "private_workdir", "non_root_user", "rlimits")


def run_probe(backend: Backend, g: Guarantees, uid_is_host_non_root: bool = True) -> None:
    """Run PROBE_CODE through `backend.run` and record each fact in `g`."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        result = backend.run(RunRequest(code=PROBE_CODE, stdin=str(port).encode(), run_timeout=30), 1 << 16)
    try:
        facts = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        reason = f"probe run failed: {result.sandbox_error or result.stderr[-500:] or result.outcome.value}"
        for name in PROBED:
            g.set(name, False, reason)
        return
    g.set("no_network", facts["no_network"], "a listener on host 127.0.0.1 was reachable")
    g.set("readonly_root", facts["readonly_root"], "'/' was writable")
    g.set("private_workdir", facts["workdir_writable"], "/work was not writable")
    g.set("non_root_user", facts["uid"] != 0 and uid_is_host_non_root, "runs as uid 0 (or root on the host)")
    g.set("rlimits", facts["rlimits"], "NOFILE/FSIZE/CORE rlimits not applied")
