"""Every pool's picker, kept across policy reloads (the index must not start cold on a reload).

``configure(policy)`` (on the event loop) keeps a pool's :class:`PoolPicker` while its routing
settings and endpoints are unchanged, builds new ones, and stops those no longer wanted;
``aclose()`` stops them all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from filters.picker.metrics import PickerMetrics
from filters.picker.pool import PoolPicker
from runtime.chat_tokenizer import TokenizerFilesError

__all__ = ["Pickers"]

_log = logging.getLogger(__name__)


class Pickers:
    def __init__(
        self,
        *,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = PickerMetrics(registry)
        self._clock = clock
        self._wall = wall
        self._pools: dict[str, tuple[Any, PoolPicker]] = {}

    def get(self, pool: str | None) -> PoolPicker | None:
        entry = self._pools.get(pool) if pool is not None else None
        return entry[1] if entry is not None else None

    def reported(self, pool: str, cached_tokens: int) -> None:
        """The cached prompt tokens a backend reported for a request of ``pool``, read by
        Envoy's usage meter (filters/usage_log.py): the picker's stream end does not see them
        there."""
        if cached_tokens > 0 and pool in self._pools:
            self.metrics.actual_tokens.labels(pool).inc(cached_tokens)

    async def configure(self, policy: Any) -> None:
        wanted = {
            name: pool
            for name, pool in policy.pools.items()
            if pool.routing.mode == "prefix_index" and pool.endpoints
        }
        for name in list(self._pools):
            key, picker = self._pools[name]
            if name not in wanted or key != _key(wanted[name]):
                del self._pools[name]
                await picker.aclose()
        for name, pool in wanted.items():
            if name in self._pools:
                continue
            picker = PoolPicker(name, pool, self.metrics, clock=self._clock, wall=self._wall)
            try:
                await picker.start()
            except TokenizerFilesError as exc:  # this pool routes by ring hash until it loads
                await picker.aclose()
                self.metrics.config_errors.labels(name).inc()
                _log.error("picker for pool %s not started (ring hash routes it): %s", name, exc)
                continue
            self._pools[name] = (_key(pool), picker)
            _log.info("picker for pool %s: %d replicas", name, len(picker.feeds))

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        for _, picker in pools.values():
            await picker.aclose()


def _key(pool: Any) -> tuple[Any, ...]:
    return (pool.routing, tuple(pool.endpoints))
