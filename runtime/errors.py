"""Errors of the shared runtime.

::

    RuntimeMachineryError
    ├── ChildError      a child process exited early or never listened
    │   └── PortTimeout     nothing listened on a port in time
    └── BuildFailed     a policy build in the build worker failed (its problems)
        ├── WorkerCrashed   the build worker died during a build
        └── BuildTimeout    a build ran past its time limit (the worker was killed)
"""

from __future__ import annotations

__all__ = [
    "BuildFailed",
    "BuildTimeout",
    "ChildError",
    "PortTimeout",
    "RuntimeMachineryError",
    "WorkerCrashed",
]


class RuntimeMachineryError(RuntimeError):
    """Base of the runtime's own errors."""


class ChildError(RuntimeMachineryError):
    """A child process exited before it was ready, or did not become ready in time."""


class PortTimeout(ChildError, TimeoutError):
    """Nothing accepted connections on a port within the timeout."""


class BuildFailed(RuntimeMachineryError):
    """A build in the build worker failed; ``problems`` are its lines (``file:line: ...``)."""

    def __init__(self, problems: tuple[str, ...] | str) -> None:
        self.problems = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("; ".join(self.problems))


class WorkerCrashed(BuildFailed):
    """The build worker process died while building (killed, out of memory)."""


class BuildTimeout(BuildFailed, TimeoutError):
    """A build ran past the worker's time limit; the worker was killed."""
