"""Errors raised by ``poolstate``.

Exception tree::

    PoolStateError
    ├── MetricsTextError      a replica's /metrics text is not Prometheus exposition
    └── PoolStateDecodeError  a pool-state JSON document does not have the documented shape
"""

from __future__ import annotations

__all__ = ["MetricsTextError", "PoolStateDecodeError", "PoolStateError"]


class PoolStateError(Exception):
    """Base of every error raised by ``poolstate``."""


class MetricsTextError(PoolStateError):
    """The scraped text could not be parsed."""


class PoolStateDecodeError(PoolStateError):
    """The JSON is not a pool state (wrong shape, missing key, wrong type)."""
