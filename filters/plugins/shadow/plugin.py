"""shadow: sample a route's requests for its shadow pool and record each primary's side.

List it on a route that has a ``shadow:`` section (docs/policy.md "Shadow traffic"). At the
request headers the plugin draws ``shadow.fraction``; a sampled request gets three internal
headers: the mirror cluster (``tokenweir_shadow``, read by the route's mirror policy; a request
without it is not mirrored), this process's shadow recorder (the cluster's ORIGINAL_DST address)
and the pair's id. The mirror is the request as the router forwards it (body clamped, internal
headers set), so the shadow pool is asked exactly what the primary pool is. The response is
watched without holding anything back: status, time to the first body chunk, end, and the
output tokens the ``usage`` plugin read; at the stream's end the primary's side goes to the
pair. Nothing here is charged or waits on I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from filters.api import BasePlugin, Context, Result, Slot
from filters.errors import ConfigError
from filters.services import Services
from policy.model import RouteShadow
from policy.phases import (
    SHADOW_CLUSTER,
    SHADOW_CLUSTER_HEADER,
    SHADOW_ID_HEADER,
    SHADOW_TO_HEADER,
)
from runtime.shadow import judge

__all__ = ["ShadowPlugin"]

_SEEN: Slot[_Seen] = Slot("shadow")  # the primary's side of its pair, as it is seen
# Envoy's router adds it to every answer that came from an upstream host (never to its own
# local replies): the primary reached the pool, so the mirror was sent too
_UPSTREAM = "x-envoy-upstream-service-time"


@dataclass(slots=True)
class _Seen:
    pair: str
    sent: float
    status: int = 0
    reached: bool = False
    first: float | None = None
    done: float | None = None


class ShadowPlugin(BasePlugin):
    name = "shadow"
    bounded = True  # no I/O

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        if settings:
            raise ConfigError(
                f"shadow: unknown setting(s) {sorted(settings)}; its knobs live in the "
                "route's 'shadow' section"
            )
        self.services = services
        self.recorder = getattr(services, "shadow", None)
        self.rng = random.Random()
        policy = services.policy
        self._routes: dict[str, tuple[RouteShadow, tuple[str, ...]]] = {}
        for gw in policy.gateways.values():
            for r in gw.routes:
                if r.shadow is not None and r.shadow.pool in policy.pools:
                    eps = tuple(str(e) for e in policy.pools[r.shadow.pool].endpoints)
                    self._routes[r.name] = (r.shadow, eps)

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        rec = self.recorder
        found = self._routes.get(ctx.route.name)
        if rec is None or rec.address is None or found is None:
            return None
        shadow, endpoints = found
        if self.rng.random() >= shadow.fraction:
            return None
        pair = rec.book.open(
            ctx.route.name, ctx.request_id, endpoints, timeout=shadow.timeout,
            keep=shadow.keep, ttl=shadow.ttl, max_inflight=shadow.max_inflight,
        )  # fmt: skip
        if pair is None:
            rec.metrics.dropped.labels("too_many_open").inc()
            return None
        rec.metrics.sampled.labels(ctx.route.name).inc()
        ctx.put(_SEEN, _Seen(pair, sent=self.services.clock()))
        return Result(
            set_headers={
                SHADOW_CLUSTER_HEADER: SHADOW_CLUSTER,
                SHADOW_TO_HEADER: rec.address,
                SHADOW_ID_HEADER: pair,
            }
        )

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        seen = ctx.get(_SEEN)
        if seen is not None:  # the last look before the router sends it (and its mirror) on
            seen.sent = self.services.clock()
        return None

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        seen = ctx.get(_SEEN)
        if seen is not None:
            try:
                seen.status = int(headers.get(":status", "0"))
            except ValueError:
                seen.status = 0
            seen.reached = _UPSTREAM in headers
        return None

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None:
        seen = ctx.get(_SEEN)
        if seen is not None:
            now = self.services.clock()
            if seen.first is None and chunk:
                seen.first = now
            if end_of_stream:
                seen.done = now
        return None

    async def stream_end(self, ctx: Context) -> None:
        seen = ctx.take(_SEEN)
        if seen is None or self.recorder is None:
            return
        end = seen.done if seen.done is not None else self.services.clock()
        status = seen.status or (ctx.status or 0)
        tokens = ctx.usage.completion_tokens if ctx.usage is not None else None
        ttft = seen.first - seen.sent if seen.first is not None else None
        side = judge(status, seen.done is not None, tokens, None, ttft, end - seen.sent)
        self.recorder.book.primary(seen.pair, side, reached=seen.reached)
