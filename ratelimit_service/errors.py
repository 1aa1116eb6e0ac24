"""Errors of the rate-limit service.

    RateLimitError           base of everything this package raises on purpose
    ├── BadRequest           a RateLimitRequest we cannot judge (unknown domain, bad descriptors,
    │                        absurd hits_addend); answered with a defined OVER_LIMIT, never raised
    │                        out of the servicer
    └── StoreUnavailable     Redis is down, slow past the deadline or answered an error; the
                             servicer falls back to the policy's redis_failure_mode

QuotaConfigError (a live quota field that cannot be parsed) belongs to the shared quota layout:
:mod:`quota.errors`.

Third-party errors (redis-py, grpc) are converted once, at the store boundary (``raise … from``).
"""

from __future__ import annotations

__all__ = ["BadRequest", "RateLimitError", "StoreUnavailable"]


class RateLimitError(Exception):
    """Base class of the rate-limit service's errors."""


class BadRequest(RateLimitError):
    """Envoy sent something we cannot judge; ``code`` goes into the OpenAI-style error body."""

    def __init__(self, message: str, code: str = "invalid_rate_limit_request") -> None:
        super().__init__(message)
        self.code = code


class StoreUnavailable(RateLimitError):
    """The quota store (Redis) could not answer in time."""
