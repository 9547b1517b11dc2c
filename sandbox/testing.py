"""Old names for `sandbox.process` (the service as a child process), kept for existing callers.

New code imports `sandbox.process.SandboxProcess`; this module goes once nothing imports it.
"""

from .process import SandboxProcess as RunningSandbox
from .process import SandboxStartError

__all__ = ["RunningSandbox", "SandboxStartError"]
