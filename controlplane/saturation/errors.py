"""Errors raised by ``controlplane.saturation``.

Exception tree::

    SaturationError
    └── ScrapeError   one replica's /metrics or /get_server_info could not be read
        └── NameNotFound  its host name does not resolve (no ready pod behind it)
"""

from __future__ import annotations

__all__ = ["NameNotFound", "SaturationError", "ScrapeError"]


class SaturationError(Exception):
    """Base of every error raised by ``controlplane.saturation``."""


class ScrapeError(SaturationError):
    """A scrape failed: connection refused, timeout, HTTP status other than 200."""


class NameNotFound(ScrapeError):
    """The replica's host name does not resolve: in Kubernetes, a headless Service with
    ``publishNotReadyAddresses: false`` answers only for ready pods, so a pod not started, still
    loading, or gone has no name. The replica is absent, not stale: it serves nothing."""
