"""Errors of the dashboard package.

DashboardError
 └── SourceError   a service's /metrics could not be read or parsed
"""

from __future__ import annotations

__all__ = ["DashboardError", "SourceError"]


class DashboardError(Exception):
    """Base of this package's errors."""


class SourceError(DashboardError):
    """A service's /metrics could not be read or parsed."""
