"""collapse: identical deterministic requests in flight become one backend request.

Opt-in per route: list it after ``tokens`` (it keys on the body as it will reach the backend,
clamp included) and before ``usage``. A request collapses when it is deterministic
(``temperature`` 0, or a fixed integer ``seed``; for ``/generate`` in ``sampling_params``) and
an identical one (same path, same body after the clamp, same tenant unless
``collapsing.share_across_tenants``) is running in this filter process. The first is the
*leader* and runs as usual; each later one is a *follower*: the plugin sets
``x-tokenweir-collapse-to`` (this process's fan-out endpoint) and ``x-tokenweir-collapse-id``
(the run) and Envoy routes it there (the ``ROUTE/collapsed`` route, an ORIGINAL_DST cluster),
where it is streamed the leader's answer chunk by chunk as the leader's response passes the
filter. A follower still passes the rate-limit filter and the usage plugin: it is charged what
it received (the leader's usage, as reported in the stream it got), like any request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from controlplane.policy.phases import COLLAPSE_ID_HEADER, COLLAPSE_TO_HEADER
from filters.api import BasePlugin, Context, Result
from filters.collapse.hub import Hub, Run
from filters.errors import ConfigError
from filters.services import Services

__all__ = ["CollapsePlugin", "collapse_key", "is_deterministic"]

_SCRATCH = "collapse"


def is_deterministic(obj: Any) -> bool:
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


def collapse_key(scope: str, path: str, obj: Any) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{scope}\0{path}\0{canonical}".encode()).hexdigest()


class CollapsePlugin(BasePlugin):
    name = "collapse"
    bounded = True  # no I/O

    def __init__(self, settings: Mapping[str, Any], services: Services) -> None:
        if settings:
            raise ConfigError(
                f"collapse: unknown setting(s) {sorted(settings)}; its knobs live in the "
                "policy's 'collapsing' section"
            )
        self.policy = services.policy.collapsing
        self.services = services
        hub = getattr(services, "collapser", None)
        self.hub: Hub = hub if hub is not None else Hub(services.clock)

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not is_deterministic(obj):
            return None
        scope = "*" if self.policy.share_across_tenants else f"t:{ctx.tenant or 'anonymous'}"
        key = collapse_key(scope, ctx.path, obj)
        metrics = self.services.metrics.collapsed
        run = self.hub.join(key, max_followers=self.policy.max_followers)
        if run is not None and self.hub.address is not None:
            ctx.scratch[_SCRATCH] = ("follower", run)
            metrics.labels(ctx.route.name, "follower").inc()
            return Result(
                set_headers={COLLAPSE_TO_HEADER: self.hub.address, COLLAPSE_ID_HEADER: run.id},
                clear_route_cache=True,
            )
        ctx.scratch[_SCRATCH] = ("leader", self.hub.lead(key))
        metrics.labels(ctx.route.name, "leader").inc()
        return None

    def _leader(self, ctx: Context) -> Run | None:
        held = ctx.scratch.get(_SCRATCH)
        return held[1] if held is not None and held[0] == "leader" else None

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        run = self._leader(ctx)
        if run is not None:
            try:
                status = int(headers.get(":status", "0"))
            except ValueError:
                status = 502
            run.headers(status, headers.get("content-type", ""))
        return None

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None:
        run = self._leader(ctx)
        if run is not None:
            run.feed(chunk, limit=self.policy.max_buffer_bytes)
            if end_of_stream:
                self.hub.finish(run, complete=True)
        return None

    async def stream_end(self, ctx: Context) -> None:
        held = ctx.scratch.pop(_SCRATCH, None)
        if held is None:
            return
        role, run = held
        if role == "leader":
            if not run.done:
                self.hub.finish(run, complete=False)
            return
        if ctx.usage is not None:
            self.services.metrics.tokens_saved.labels(ctx.route.name, "collapse").inc(
                ctx.usage.total
            )
