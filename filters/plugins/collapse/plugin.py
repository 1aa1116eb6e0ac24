"""collapse: identical deterministic requests in flight become one backend request.

Opt-in per route: list it after ``tokens`` (it keys on the body as it will reach the backend,
clamp included) and before ``usage``. A request collapses when it is deterministic
(``temperature`` 0, or a fixed integer ``seed``; for ``/generate`` in ``sampling_params``) and
an identical one (same path, same body after the clamp, same tenant unless
``collapsing.share_across_tenants``) is running. The first is the run's *leader*, each later
one a *follower*; the plugin points both at a fan-out endpoint (``x-tokenweir-collapse-to``,
``x-tokenweir-collapse-id``; Envoy routes them there by the ``ROUTE/collapsed`` route, an
ORIGINAL_DST cluster) that sends the one backend request itself and streams its answer to every
caller, chunk by chunk. A caller that leaves never cuts the others; the backend request is
cancelled only when no caller is left.

Across filter processes (``replicas.filters`` or ``filters.processes`` > 1, or several hosts):
a leader publishes its run in Redis (``tw:{collapse}:<fingerprint>`` → fan-out address and run
id, for ``collapsing.follower_timeout`` at most, removed when the answer ends), so an identical
request that lands on another filter process follows it there. Without Redis, or while it
fails, runs are found within one filter process only.

Every caller still passes the rate-limit filter and the usage plugin: it is charged what it
received (the whole answer, or what reached it before it left), like any request.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from filters.api import BasePlugin, Context, Result, Slot
from filters.bodies import json_of
from filters.errors import ConfigError
from filters.plugins.collapse.hub import Hub, Origin, Run, registry_key
from filters.services import Services
from policy.phases import COLLAPSE_ID_HEADER, COLLAPSE_TO_HEADER
from wire.contract import HEADER_PREFIX

__all__ = ["CollapsePlugin", "collapse_key", "is_deterministic", "replica_order"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Joined:
    """The run this request leads or follows, left at the stream's end."""

    role: str  # leader | follower
    run: Run


_JOINED: Slot[_Joined] = Slot("collapse")
_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host", "content-length"}
)


def is_deterministic(obj: object) -> bool:
    """``temperature`` 0 or an integer ``seed`` (OpenAI), or the same in ``sampling_params``."""
    if not isinstance(obj, dict):
        return False
    params = obj.get("sampling_params")
    src = params if isinstance(params, dict) else obj
    t = src.get("temperature")
    if isinstance(t, int | float) and not isinstance(t, bool) and t == 0:
        return True
    seed = src.get("seed", obj.get("seed"))
    return isinstance(seed, int) and not isinstance(seed, bool)


def collapse_key(scope: str, path: str, obj: object) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{scope}\0{path}\0{canonical}".encode()).hexdigest()


def replica_order(key: str, endpoints: tuple[str, ...]) -> tuple[str, ...]:
    """Rendezvous order: identical requests try the same replica first (its prefix cache)."""
    return tuple(sorted(endpoints, key=lambda e: hashlib.sha256(f"{key}\0{e}".encode()).digest()))


class CollapsePlugin(BasePlugin):
    name = "collapse"
    bounded = True  # its one Redis read has the client's timeout

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        if settings:
            raise ConfigError(
                f"collapse: unknown setting(s) {sorted(settings)}; its knobs live in the "
                "policy's 'collapsing' section"
            )
        self.policy = services.policy.collapsing
        self.services = services
        hub = getattr(services, "collapser", None)
        self.hub: Hub = hub if hub is not None else Hub(services.clock)
        self.redis = services.redis

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        obj = json_of(ctx, body)  # the body as it reaches the backend, decoded once per request
        if obj is None or not is_deterministic(obj) or self.hub.address is None:
            return None
        scope = "*" if self.policy.share_across_tenants else f"t:{ctx.tenant or 'anonymous'}"
        key = collapse_key(scope, ctx.path, obj)
        metrics = self.services.metrics.collapsed
        run = self.hub.join(key, max_followers=self.policy.max_followers)
        if run is not None:
            ctx.put(_JOINED, _Joined("follower", run))
            metrics.labels(ctx.route.name, "follower").inc()
            return _to(self.hub.address, run.id)
        origin = self._origin(ctx, key, body)
        if origin is None:
            return None
        # the run exists before any wait: an identical request arriving meanwhile joins it
        run = self.hub.lead(key, origin)
        role = "follower" if await self._publish(run) else "leader"
        ctx.put(_JOINED, _Joined(role, run))
        metrics.labels(ctx.route.name, role).inc()
        return _to(self.hub.address, run.id)

    def _origin(self, ctx: Context, key: str, body: bytes) -> Origin | None:
        pool = self.services.policy.pools.get(ctx.route.pool) if ctx.route.pool else None
        if pool is None or not pool.endpoints:
            return None
        headers = tuple(
            (k, v) for k, v in ctx.request_headers.items()
            if not k.startswith(":") and k not in _HOP and not k.startswith(HEADER_PREFIX)
        )  # fmt: skip
        endpoints = replica_order(key, tuple(str(e) for e in pool.endpoints))
        return Origin(ctx.method or "POST", ctx.path, headers, body, endpoints)

    async def _publish(self, run: Run) -> bool:
        """Make the run findable by other filter processes (Redis ``SET NX GET``). When another
        process already runs the same request, this run reads that one's fan-out stream
        instead of the backend (one backend request mesh-wide); returns True then."""
        if self.redis is None or run.origin is None:
            return False
        key, value = registry_key(run.key), f"{self.hub.address} {run.id}"
        ttl_ms = max(1, int(self.policy.follower_timeout * 1000))
        try:
            old = await self.redis.set(key, value, nx=True, px=ttl_ms, get=True)
            if old is not None:
                text = old.decode() if isinstance(old, bytes) else str(old)
                address, _, other = text.partition(" ")
                if other and address != self.hub.address:
                    o = run.origin
                    run.origin = replace(
                        o, endpoints=(address,), headers=((COLLAPSE_ID_HEADER, other),),
                        fallback=o,
                    )  # fmt: skip
                    return True
                await self.redis.set(key, value, px=ttl_ms)  # ours, already ended: take it
            run.published = True  # unpublished by the fan-out endpoint when the run ends
        except Exception as exc:  # Redis failing: the run is found within this process only
            _log.debug("collapse run not published: %s", exc)
        return False

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None:
        return None  # listed so Envoy keeps the stream open to the response's end (stream_end)

    async def stream_end(self, ctx: Context) -> None:
        held = ctx.take(_JOINED)
        if held is None:
            return
        role = held.role
        self.hub.leave(held.run)
        if role != "leader" and ctx.usage is not None:
            self.services.metrics.tokens_saved.labels(ctx.route.name, "collapse").inc(
                ctx.usage.total
            )


def _to(address: str, run_id: str) -> Result:
    return Result(
        set_headers={COLLAPSE_TO_HEADER: address, COLLAPSE_ID_HEADER: run_id},
        clear_route_cache=True,
    )
