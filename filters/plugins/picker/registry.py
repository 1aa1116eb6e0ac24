"""Every pool's picker, kept across policy reloads (the index must not start cold on a reload).

``configure(policy)`` (on the event loop) keeps a pool's :class:`PoolPicker` while its routing
settings and endpoints are unchanged, builds new ones, and stops those no longer wanted;
``aclose()`` stops them all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeAlias

from prometheus_client import CollectorRegistry

from chat.tokenizer import TokenizerFilesError
from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.pool import PoolPicker
from filters.plugins.picker.regret import from_log, observe
from policy.common import Address
from policy.model import LlmPool, Policy
from policy.routing import RoutingPolicy

__all__ = ["Pickers"]

_log = logging.getLogger(__name__)
# what a pool's picker is built from: a change of either builds it anew
_PoolKey: TypeAlias = tuple[RoutingPolicy, tuple[Address, ...]]


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
        self._pools: dict[str, tuple[_PoolKey, PoolPicker]] = {}

    def get(self, pool: str | None) -> PoolPicker | None:
        entry = self._pools.get(pool) if pool is not None else None
        return entry[1] if entry is not None else None

    def metered(self, pool: str, fields: Mapping[str, object]) -> None:
        """One request of ``pool`` that Envoy's usage meter covered (filters/usage_log.py: the
        picker's stream end sees no usage there): the cached prompt tokens the backend reported,
        and the routing regret of the pick (filters/plugins/picker/regret.py) when the picker placed it."""
        picker = self.get(pool)
        if picker is None:
            return
        cached = fields.get("cached_tokens")
        reported = isinstance(fields.get("completion_tokens"), float)
        if reported and isinstance(cached, float) and cached > 0:
            self.metrics.actual_tokens.labels(pool).inc(cached)
        facts = from_log(fields)
        if facts is not None:
            observe(self.metrics, picker.latency, pool, **facts)

    async def configure(self, policy: Policy) -> None:
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


def _key(pool: LlmPool) -> _PoolKey:
    return (pool.routing, tuple(pool.endpoints))
