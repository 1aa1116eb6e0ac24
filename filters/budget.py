"""What a tenant's token budget still holds, for the max_tokens clamp.

The rate-limit service owns the numbers (``ratelimit_service.reader.QuotaReader``); this module
only adapts it. ``None`` means "unknown or unlimited": the clamp then uses the tier cap alone.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

__all__ = ["Budget", "NoBudget", "quota_reader_budget"]

_log = logging.getLogger(__name__)


class Budget(Protocol):
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None: ...


class NoBudget:
    async def remaining(
        self, tenant: str, model: str | None = None, lane: str | None = None
    ) -> int | None:
        return None


def quota_reader_budget(redis: Any, policy: Any) -> Budget:
    """The rate-limit service's reader over ``redis``, or :class:`NoBudget` when not available."""
    try:
        from ratelimit_service.reader import QuotaReader
    except ImportError:
        _log.warning("ratelimit_service.reader is not available: max_tokens uses tier caps only")
        return NoBudget()
    reader: Budget = QuotaReader(redis, policy)
    return reader
