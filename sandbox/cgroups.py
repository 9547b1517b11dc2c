"""A pool of pre-created cgroups, one per concurrent execution (cgroup v1 or v2).

Why a pool: creating and removing a memory cgroup per run costs more than the run of `print(1)`
itself on v1, and removed memcgs linger as offline css. Slots are created once, reused after
every pid in them is killed, and removed when the service stops, so nothing is left behind.

Why cgroups at all: a pid namespace alone does not bound memory or process count, and `kill`
on a process group misses `setsid` escapees; a cgroup sees every descendant.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import queue
import signal
import time
from dataclasses import dataclass

KILL_DEADLINE_S = 5.0

log = logging.getLogger(__name__)


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) for every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if rfields and rfields[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], rfields[0], set(rfields[2].split(",")) if len(rfields) > 2 else set()))
    return out


def _own_paths() -> dict[str, str]:
    """Controller name (or '' for v2) -> this process's cgroup path."""
    return _own_paths_of(os.getpid())


def _pids_in(procs_file: str) -> list[int]:
    try:
        return [int(p) for p in _read(procs_file).split()]
    except FileNotFoundError:
        return []


def _kill_until_empty(procs_files: list[str], keep: frozenset[int] = frozenset()) -> int:
    """SIGKILL every pid listed (but `keep`) until none is left; returns how many kills were sent."""
    sent, deadline = 0, time.monotonic() + KILL_DEADLINE_S
    while time.monotonic() < deadline:
        pids = {p for f in procs_files for p in _pids_in(f)} - keep
        if not pids:
            return sent
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                sent += 1
            except ProcessLookupError:
                pass
        time.sleep(0.002)
    raise RuntimeError(f"cgroup still not empty after {KILL_DEADLINE_S}s: {procs_files}")


@dataclass
class Slot:
    """One execution cgroup. `attach_files` are the cgroup.procs files the child joins."""

    version: int
    dirs: dict[str, str]  # controller ('memory', 'pids', or '' for v2) -> directory

    @property
    def attach_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def _mem(self) -> str:
        return self.dirs["memory" if self.version == 1 else ""]

    def _pids(self) -> str:
        return self.dirs["pids" if self.version == 1 else ""]

    def set_limits(self, memory_bytes: int, pids: int) -> None:
        mem = self._mem()
        if self.version == 1:
            limit, memsw = os.path.join(mem, "memory.limit_in_bytes"), os.path.join(mem, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):
                # memsw must stay >= limit at every moment, so the write order depends on direction.
                try:
                    _write(memsw, str(memory_bytes))
                    _write(limit, str(memory_bytes))
                except OSError:
                    _write(limit, str(memory_bytes))
                    _write(memsw, str(memory_bytes))
            else:
                _write(limit, str(memory_bytes))
        else:
            _write(os.path.join(mem, "memory.max"), str(memory_bytes))
            swap = os.path.join(mem, "memory.swap.max")
            if os.path.exists(swap):
                _write(swap, "0")
        _write(os.path.join(self._pids(), "pids.max"), str(pids))

    def oom_kills(self) -> int:
        """Monotonic count of OOM kills in this slot (compare before/after a run)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in _read(os.path.join(self._mem(), name)).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def pids(self) -> list[int]:
        return sorted({p for f in self.attach_files for p in _pids_in(f)})

    def charged_pids(self) -> int:
        """`pids.current`: live tasks *and* unreaped zombies, which `cgroup.procs` no longer lists."""
        return int(_read(os.path.join(self._pids(), "pids.current")))

    def wait_uncharged(self, timeout: float = KILL_DEADLINE_S) -> bool:
        """Wait until the pids controller charges nothing here, so the next run gets all of `pids.max`."""
        deadline = time.monotonic() + timeout
        while self.charged_pids() > 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return True

    def kill_all(self, keep: frozenset[int] = frozenset()) -> int:
        """Kill every process in the slot (setsid escapees included) except the pids in `keep`."""
        if self.version == 2 and not keep:
            kill_file = os.path.join(self.dirs[""], "cgroup.kill")
            if os.path.exists(kill_file) and self.pids():
                _write(kill_file, "1")
        return _kill_until_empty(self.attach_files, keep)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as err:  # EBUSY while the last exiting task is reaped
                    if err.errno != errno.EBUSY:
                        raise
                    time.sleep(0.01)


class CgroupPool:
    """`size` slots under one parent per controller, named after this service's pid."""

    def __init__(self, size: int, version: int, parents: dict[str, str]) -> None:
        self.version = version
        self.parents = parents
        self._free: queue.Queue[Slot] = queue.Queue()
        self.slots: list[Slot] = []
        for ctrl, parent in parents.items():
            os.makedirs(parent, exist_ok=True)
            if version == 2:
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
        for i in range(size):
            dirs = {}
            for ctrl, parent in parents.items():
                d = os.path.join(parent, f"slot{i}")
                os.makedirs(d, exist_ok=True)
                dirs[ctrl] = d
            slot = Slot(version, dirs)
            self.slots.append(slot)
            self._free.put(slot)

    def acquire(self, timeout: float | None = None) -> Slot:
        return self._free.get(timeout=timeout)

    def release(self, slot: Slot) -> None:
        """Return a slot only once it is empty, so the next run starts clean."""
        slot.kill_all()
        self._free.put(slot)

    def close(self) -> None:
        for slot in self.slots:
            slot.remove()
        for parent in self.parents.values():
            try:
                os.rmdir(parent)
            except OSError:
                pass


def _v1_parent(mounts: list[tuple[str, str, set[str]]], ctrl: str, own: dict[str, str], leaf: str) -> str:
    for point, fstype, opts in mounts:
        if fstype == "cgroup" and ctrl in opts:
            for base in (own.get(ctrl, "/"), "/"):
                candidate = os.path.join(point, base.lstrip("/"), leaf)
                if os.access(os.path.dirname(candidate), os.W_OK):
                    return candidate
    raise OSError(f"no writable cgroup v1 '{ctrl}' hierarchy")


def _v2_parent(mounts: list[tuple[str, str, set[str]]], leaf: str) -> str:
    for point, fstype, _ in mounts:
        if fstype != "cgroup2":
            continue
        try:
            available = set(_read(os.path.join(point, "cgroup.controllers")).split())
        except OSError:
            continue
        if {"memory", "pids"} <= available:
            root_ctl = os.path.join(point, "cgroup.subtree_control")
            _write(root_ctl, "+memory +pids")  # the hierarchy root is exempt from "no internal procs"
            return os.path.join(point, leaf)
    raise OSError("no cgroup v2 hierarchy with memory and pids controllers")


LEAF_PREFIX = "sgrpo-sandbox-"
_pools_made = itertools.count()  # a second pool in one process gets a tree of its own


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(version: int, parents: dict[str, str]) -> list[str]:
    """Remove the slot trees of services that died without cleaning up (SIGKILL, OOM, power).

    Sibling `sgrpo-sandbox-<pid>` dirs whose pid is gone are emptied (kill what is left) and
    removed; returns the parents removed. A live pid, even a reused one, is left alone.
    """
    removed = []
    owners: dict[int, dict[str, str]] = {}
    for ctrl, parent in parents.items():
        base = os.path.dirname(parent)
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            pid = name[len(LEAF_PREFIX):].split("-")[0]  # sgrpo-sandbox-<pid> or sgrpo-sandbox-<pid>-<n>
            if name.startswith(LEAF_PREFIX) and pid.isdigit() and os.path.join(base, name) != parent:
                owners.setdefault(int(pid), {})[ctrl] = os.path.join(base, name)
    for pid, dead in owners.items():
        if _pid_alive(pid):
            continue
        try:
            slots = sorted({n for d in dead.values() for n in os.listdir(d) if os.path.isdir(os.path.join(d, n))})
            for name in slots:
                Slot(version, {c: os.path.join(d, name) for c, d in dead.items()
                               if os.path.isdir(os.path.join(d, name))}).remove()
            for d in dead.values():
                os.rmdir(d)
                removed.append(d)
        except (OSError, RuntimeError) as err:  # never a reason to refuse to start
            log.warning("could not remove the stale sandbox cgroups of pid %d: %s", pid, err)
    return removed


def create_pool(size: int) -> CgroupPool:
    """Prefer cgroup v2 when its memory+pids controllers are usable, else v1; raise OSError if neither.

    Slot trees left by dead services are swept first, so crashes do not pile up cgroups. The tree is
    named after this process (and numbered after its first): its slots hold warm sandboxes for the
    pool's whole life, so two pools must never share one."""
    mounts, own = _mounts(), _own_paths()
    n = next(_pools_made)
    leaf = f"{LEAF_PREFIX}{os.getpid()}" + (f"-{n}" if n else "")
    errors = []
    try:
        parents = {"": _v2_parent(mounts, leaf)}
        sweep_stale(2, parents)
        return CgroupPool(size, 2, parents)
    except OSError as err:
        errors.append(f"v2: {err}")
    try:
        parents = {c: _v1_parent(mounts, c, own, leaf) for c in ("memory", "pids")}
        sweep_stale(1, parents)
        return CgroupPool(size, 1, parents)
    except OSError as err:
        errors.append(f"v1: {err}")
    raise OSError("; ".join(errors))


def slot_of_process(pid: int) -> Slot | None:
    """The memory+pids cgroups that host process `pid` lives in (e.g. a container's init), or None
    when they are not visible from here (remote engine, other mount namespace)."""
    try:
        paths = _own_paths_of(pid)
        mounts = _mounts()
    except OSError:
        return None
    if "" in paths and len(paths) == 1:  # pure v2
        for point, fstype, _ in mounts:
            d = os.path.join(point, paths[""].lstrip("/"))
            if fstype == "cgroup2" and os.path.exists(os.path.join(d, "memory.events")):
                return Slot(2, {"": d})
        return None
    dirs = {}
    for ctrl in ("memory", "pids"):
        for point, fstype, opts in mounts:
            d = os.path.join(point, paths.get(ctrl, "/").lstrip("/"))
            if fstype == "cgroup" and ctrl in opts and os.path.isdir(d):
                dirs[ctrl] = d
    return Slot(1, dirs) if len(dirs) == 2 else None


def _own_paths_of(pid: int) -> dict[str, str]:
    paths = {}
    for line in _read(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path
    return paths
