"""canary: the version of a pool with a canary — forced by a header for allowed tenants, and
counted per version for the control plane's rollback watch.

Request headers: a tenant listed in the pool's ``canary.force_tenants`` may send the pool's
``canary.force_header`` (``canary``/``1``/``true`` or ``baseline``/``0``/``false``); the plugin
then sets ``x-tokenweir-canary`` and Envoy takes the forced route. Anyone else's header is
ignored (counted as ``ignored``): the weight and the session hash decide. Response headers:
Envoy tags each response of such a pool with ``x-tokenweir-version``; the plugin counts it by
version and status class in ``tokenweir_filters_version_responses_total{pool,version,code}``,
which the control plane reads to compare the canary's 5xx rate with the baseline's.
Put it after ``identity``.
"""

from __future__ import annotations

from collections.abc import Mapping

from filters.api import BasePlugin, Context, Result
from filters.errors import ConfigError
from filters.services import Services
from policy.canary import CanaryPolicy
from policy.phases import CANARY_HEADER, VERSION_HEADER

__all__ = ["CanaryPlugin"]

_CANARY = frozenset({"canary", "1", "true", "on"})
_BASELINE = frozenset({"baseline", "0", "false", "off"})


class CanaryPlugin(BasePlugin):
    name = "canary"
    bounded = True

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        if settings:
            raise ConfigError(f"canary: unknown setting(s) {sorted(settings)}")
        self.services = services

    def _canary(self, ctx: Context) -> CanaryPolicy | None:
        pool = self.services.policy.pools.get(ctx.route.pool) if ctx.route.pool else None
        return pool.canary if pool is not None else None

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        canary = self._canary(ctx)
        if canary is None:
            return None
        raw = headers.get(canary.force_header)
        if raw is None:
            return None
        value = raw.strip().lower()
        version = "canary" if value in _CANARY else "baseline" if value in _BASELINE else None
        forced = self.services.metrics.canary_forced
        if version is None or ctx.tenant not in canary.force_tenants:
            forced.labels(ctx.route.pool, "ignored").inc()
            return None
        forced.labels(ctx.route.pool, version).inc()
        return Result(
            set_headers={CANARY_HEADER: version},
            remove_headers=(canary.force_header,),
            clear_route_cache=True,
        )

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        version = headers.get(VERSION_HEADER)
        if version in ("canary", "baseline") and ctx.route.pool:
            code = headers.get(":status", "0")[:1] + "xx"
            self.services.metrics.version_responses.labels(ctx.route.pool, version, code).inc()
        return None
