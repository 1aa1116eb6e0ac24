"""Errors of the quota layout.

::

    QuotaError
    ├── QuotaConfigError   a quota field (policy default or live Redis value) that cannot be used
    └── QuotaUnavailable   Redis could not answer a peek (down, or an error reply)
"""

from __future__ import annotations

__all__ = ["QuotaConfigError", "QuotaError", "QuotaUnavailable"]


class QuotaError(Exception):
    """Base of the quota layout's errors."""


class QuotaConfigError(QuotaError):
    """A quota field (policy default or live Redis value) that cannot be used."""


class QuotaUnavailable(QuotaError):
    """Redis could not answer (connection, error reply); the caller falls back."""
