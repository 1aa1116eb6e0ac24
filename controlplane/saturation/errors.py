"""Errors raised by ``controlplane.saturation``.

Exception tree::

    SaturationError
    └── ScrapeError   one replica's /metrics or /get_server_info could not be read
"""

from __future__ import annotations

__all__ = ["SaturationError", "ScrapeError"]


class SaturationError(Exception):
    """Base of every error raised by ``controlplane.saturation``."""


class ScrapeError(SaturationError):
    """A scrape failed: connection refused, timeout, HTTP status other than 200."""
