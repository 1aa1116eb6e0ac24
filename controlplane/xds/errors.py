"""Errors of the xDS side of the control plane.

Exception tree::

    XdsError
     ├── InconsistentSnapshotError   a snapshot names a resource it does not contain
     └── UnknownGroupError           a node group has no snapshot yet
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["InconsistentSnapshotError", "UnknownGroupError", "XdsError"]


class XdsError(Exception):
    """Base of every error raised by ``controlplane.xds``."""


class InconsistentSnapshotError(XdsError):
    """A snapshot has dangling references; ``problems`` lists every one of them."""

    def __init__(self, version: str, problems: Sequence[str]) -> None:
        self.version = version
        self.problems = tuple(problems)
        lines = "\n  ".join(self.problems)
        super().__init__(f"snapshot {version!r} is inconsistent:\n  {lines}")


class UnknownGroupError(XdsError):
    """No snapshot was ever published for this node group."""
