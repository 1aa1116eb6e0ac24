"""Errors of the shared runtime.

::

    RuntimeMachineryError
    ├── ChildError      a child process exited early or never listened
    └── PortTimeout     nothing listened on a port in time
"""

from __future__ import annotations

__all__ = ["ChildError", "PortTimeout", "RuntimeMachineryError"]


class RuntimeMachineryError(RuntimeError):
    """Base of the runtime's own errors."""


class ChildError(RuntimeMachineryError):
    """A child process exited before it was ready, or did not become ready in time."""


class PortTimeout(ChildError, TimeoutError):
    """Nothing accepted connections on a port within the timeout."""
