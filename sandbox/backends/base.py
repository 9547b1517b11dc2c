"""The one interface every isolation layer implements, plus the guarantee report.

The service only talks to `Backend`; isolation is swappable behind it (the SandboxFusion idea).
Each backend probes at start-up which guarantees really hold on this host, so `/health` reports
facts rather than intentions and the service can refuse to start when one is missing.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from ..api import ExecResult, RunRequest

# The guarantees the issue asks for; every backend reports each one as held or not.
GUARANTEES = (
    "no_network",
    "readonly_root",
    "private_workdir",
    "non_root_user",
    "memory_limit",
    "pids_limit",
    "kill_all_on_timeout",
    "rlimits",
)


class IsolationError(RuntimeError):
    """Raised at start-up when a guarantee is missing and weaker isolation was not allowed."""


class EnvironmentMissing(RuntimeError):
    """A piece of the host the backend needs is absent (no Docker engine answers, the image is
    not built): the operator's to install, not a fault of this code. Tests skip on it alone."""


@dataclass
class Guarantees:
    """Which guarantees held in the start-up probe, with a reason for each one that did not."""

    held: dict[str, bool] = field(default_factory=lambda: {g: False for g in GUARANTEES})
    reasons: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, ok: bool, reason: str = "") -> None:
        if name not in GUARANTEES:
            raise KeyError(name)
        self.held[name] = ok
        if ok:
            self.reasons.pop(name, None)
        else:
            self.reasons[name] = reason or "probe failed"

    @property
    def missing(self) -> list[str]:
        return [g for g, ok in self.held.items() if not ok]

    def enforce(self, allow_weaker: bool) -> None:
        """Refuse to serve with a hole in the isolation unless the operator opted in."""
        if self.missing and not allow_weaker:
            details = "; ".join(f"{g}: {self.reasons.get(g, '?')}" for g in self.missing)
            raise IsolationError(
                f"isolation guarantees missing ({details}); pass --allow-weaker-isolation to run anyway")

    def as_dict(self) -> dict[str, object]:
        return {"held": dict(self.held), "missing": self.missing, "reasons": dict(self.reasons)}


class Backend(abc.ABC):
    """Runs one validated request in isolation; must be safe to call from many threads."""

    name: str = "abstract"

    @abc.abstractmethod
    def probe(self) -> Guarantees:
        """Check on this host which guarantees hold (called once at start-up)."""

    @abc.abstractmethod
    def run(self, request: RunRequest, max_output_bytes: int) -> ExecResult:
        """Execute `request.code` as /work/main.py and report what happened."""

    def stats(self) -> dict[str, float]:
        """Backend-specific gauges for /metrics (pool size, recycled containers, ...)."""
        return {}

    def abort_runs(self, reason: str) -> None:
        """End every run in progress now (shutdown past its drain deadline): each is answered as a
        SandboxError saying `reason`, and no new run starts."""

    def close(self) -> None:
        """Release every process, cgroup and container this backend created."""
