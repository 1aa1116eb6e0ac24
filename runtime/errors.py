"""Errors of the shared runtime.

::

    RuntimeMachineryError
    ├── ChildError      a child process exited early or never listened
    │   ├── PortTimeout     nothing listened on a port in time
    │   └── PipeCallError   a call to a pipe child (runtime/pipechild.py) got no answer
    │       ├── CallFailed      the child answered that the call failed (its problems)
    │       ├── CallTimedOut    the call ran past its time (the child was killed)
    │       ├── ChildDied       the child died during the call
    │       └── FrameTooLarge   a frame over the protocol's size limit
    ├── BuildFailed     a policy build in the build worker failed (its problems)
    │   ├── WorkerCrashed   the build worker died during a build
    │   └── BuildTimeout    a build ran past its time limit (the worker was killed)
    └── PlaintextRefused  a service asked to listen beyond loopback without TLS
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = [
    "BuildFailed",
    "BuildTimeout",
    "CallFailed",
    "CallTimedOut",
    "ChildDied",
    "ChildError",
    "FrameTooLarge",
    "PipeCallError",
    "PlaintextRefused",
    "PortTimeout",
    "Problems",
    "RuntimeMachineryError",
    "WorkerCrashed",
    "problem_lines",
]


class RuntimeMachineryError(RuntimeError):
    """Base of the runtime's own errors."""


class ChildError(RuntimeMachineryError):
    """A child process exited before it was ready, or did not become ready in time."""


class PortTimeout(ChildError, TimeoutError):
    """Nothing accepted connections on a port within the timeout."""


class PipeCallError(ChildError):
    """A call to a child served over its pipes (runtime/pipechild.py) got no answer."""


class CallFailed(PipeCallError):
    """The child answered that the call failed; ``problems`` are its lines."""

    def __init__(self, problems: tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class CallTimedOut(PipeCallError, TimeoutError):
    """A call ran past the child's time limit; the child was killed."""


class ChildDied(PipeCallError):
    """The child died (killed, out of memory) during a call; ``code``: its exit status."""

    def __init__(self, message: str, code: int | None) -> None:
        self.code = code
        super().__init__(message)


class FrameTooLarge(PipeCallError):
    """A frame over the protocol's size limit (the request was not sent, or the child was
    killed)."""


class BuildFailed(RuntimeMachineryError):
    """A build in the build worker failed; ``problems`` are its lines (``file:line: ...``)."""

    def __init__(self, problems: tuple[str, ...] | str) -> None:
        self.problems = (problems,) if isinstance(problems, str) else tuple(problems)
        super().__init__("; ".join(self.problems))


class WorkerCrashed(BuildFailed):
    """The build worker process died while building (killed, out of memory)."""


class BuildTimeout(BuildFailed, TimeoutError):
    """A build ran past the worker's time limit; the worker was killed."""


class PlaintextRefused(RuntimeMachineryError):
    """A gRPC service asked to listen beyond loopback without TLS (runtime/tls_server.py)."""


@runtime_checkable
class Problems(Protocol):
    """An error that lists its problems, one ``file:line: key.path: message`` each: the policy's
    ``PolicyError`` (policy/errors.py). Named by shape, so the runtime imports no policy."""

    @property
    def issues(self) -> Iterable[object]: ...


def problem_lines(path: Path, exc: Exception) -> tuple[str, ...]:
    """The lines a failed build of ``path`` reports: one per listed problem, else one."""
    if isinstance(exc, Problems):
        return tuple(str(i) for i in exc.issues)
    return (f"{path}: {type(exc).__name__}: {exc}",)
