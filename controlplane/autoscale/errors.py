"""Errors of the online planner.

::

    AutoscaleError
     └── ReplicaStartError   a replica ``up --autoscale`` started did not become ready
"""

from __future__ import annotations

__all__ = ["AutoscaleError", "ReplicaStartError"]


class AutoscaleError(Exception):
    """Base of the online planner's errors."""


class ReplicaStartError(AutoscaleError):
    """A replica exited, or did not answer ``/health``, before its load time ran out."""
