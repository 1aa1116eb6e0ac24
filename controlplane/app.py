"""The control plane process: snapshot cache + ADS server + policy reloader + pool scraper +
/metrics, the pool-state API (``GET /api/v1/pools``, docs/operations.md) and the live dashboard
(``GET /dashboard/``, reading ``GET /api/v1/overview``, docs/api.md).

The gRPC server also answers ``grpc.health.v1.Health`` (and ``/healthz`` on the metrics port).
``drain`` reports NOT_SERVING and stops reloading; it does not wait for xDS streams, which never
end on their own: an Envoy keeps its last config when its stream closes and reconnects.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from controlplane.autoscale import Autoscaler
from controlplane.canary import CanaryWatcher, OverrideCache
from controlplane.canary.shadow import ShadowWatcher
from controlplane.dashboard.api import Dashboard
from controlplane.dashboard.quota import QuotaWindows
from controlplane.reloader import PolicyCheck, Reloader, ReloadResult
from controlplane.saturation.api import pool_routes
from controlplane.saturation.eds import EdsMarks
from controlplane.saturation.fetch import HttpFetcher
from controlplane.saturation.scraper import PoolScraper
from controlplane.saturation.targets import targets_from_policy
from controlplane.xds.server import XdsServer
from policy import Address, Policy
from policy.servers import Replicas
from poolstate.valley_reader import ValleyReader
from runtime.admin_auth import AdminTls
from runtime.buildworker import Target
from runtime.grpc_health import AioHealth
from runtime.health import HealthState
from runtime.metrics_http import MetricsServer

__all__ = ["ADS_SERVICE", "ControlPlane", "ControlPlaneSettings"]

log = logging.getLogger("tokenweir.controlplane")

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"


@dataclass(frozen=True)
class ControlPlaneSettings:
    policy_path: Path
    xds: Address
    metrics: Address
    debounce: float = 0.1
    replicas: Replicas | None = None  # overrides the policy's `replicas:` (`up --replicas`)
    redis_url: str | None = None  # the quotas' Redis (the dashboard); else ratelimit.redis_url
    admin_token: str | None = None  # required by /metrics, /api/v1, the dashboard (admin_auth)
    admin_tls: AdminTls | None = None  # HTTPS there; client certificates instead of the token


class ControlPlane:
    """Owns every task it starts; ``aclose`` stops them all."""

    def __init__(
        self,
        settings: ControlPlaneSettings,
        *,
        check: PolicyCheck | None = None,
        build_worker: Target | None = None,
    ) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        # canary rollbacks rewrite every snapshot set (controlplane/canary)
        self.cache = OverrideCache()
        self.health = HealthState([ADS_SERVICE])
        self._aio_health = AioHealth(self.health)
        self.xds = XdsServer(self.cache, registry=self.registry, services=[self._aio_health.add_to])
        self._canary_fetcher = HttpFetcher()
        self.scraper = PoolScraper(
            HttpFetcher(), clock=time.monotonic, wall_clock=time.time, registry=self.registry
        )
        self.canary = CanaryWatcher(
            self.cache,
            self._canary_fetcher.metrics,
            clock=time.monotonic,
            wall=time.time,
            registry=self.registry,
        )
        self.shadow = ShadowWatcher(self._canary_fetcher.metrics)
        self.eds = EdsMarks(self.cache, registry=self.registry)
        self.scraper.subscribe(self.eds.on_state)
        self.autoscaler = Autoscaler(clock=time.monotonic, registry=self.registry)  # issue 42
        self.scraper.tap(self.autoscaler.tap)
        self.scraper.subscribe(self.autoscaler.on_state)
        self.autoscaler.follow_starting(self.scraper.set_starting)  # Retry-After while loading
        self.reloader = Reloader(
            settings.policy_path,
            self.cache,
            registry=self.registry,
            debounce=settings.debounce,
            on_policy=self._on_policy,
            check=check,  # the services' builders (tokenweir.check), given by the CLI
            transform=self.eds.transform,
            adjust=self._adjust if settings.replicas is not None else None,
            build_worker=build_worker,  # tokenweir.check.reloader_prepare, given by the CLI
        )
        self.fetcher = HttpFetcher()
        self.dashboard = Dashboard(
            self.fetcher,
            pools=lambda: self.scraper.state.to_json(),
            nodes=self.xds.nodes,
            quotas=QuotaWindows(settings.redis_url, registry=self.registry),
        )
        # the batch runners' lines, which the planner does not count as demand
        # (poolstate/valley.py), read through the dashboard's Redis client (the quotas')
        self.valley = ValleyReader(
            self.dashboard.quotas.redis, clock=time.monotonic, wall=time.time
        )
        self.autoscaler.valley = self.valley.words
        self.dashboard.collector.follow(  # arrivals by lane for the online planner
            lambda now, totals: self.autoscaler.on_lanes(now, totals.lane_arrivals())
        )
        self.metrics = MetricsServer(
            self.registry,
            settings.metrics.host,
            settings.metrics.port,
            health=self.health,
            token=settings.admin_token,
            tls=settings.admin_tls,
            routes=[
                *pool_routes(self.scraper),
                *self.canary.routes(),
                *self.shadow.routes(),
                *self.dashboard.routes(),
                *self.autoscaler.routes(),
            ],
        )

    def _adjust(self, policy: Policy) -> Policy:
        return dataclasses.replace(policy, replicas=self.settings.replicas or policy.replicas)

    def _on_policy(self, policy: Policy) -> None:
        settings, targets = targets_from_policy(policy)
        self.scraper.configure(settings, targets)
        self.eds.set_weights({pool: t.degraded_weight for pool, t in targets.items()})
        self.canary.configure(policy)
        self.shadow.configure(policy)
        self.dashboard.on_policy(policy)
        self.autoscaler.configure(policy)
        self.valley.configure(self.autoscaler.valley_pools(policy))

    async def start(self) -> ReloadResult:
        """Load the policy (a rejected file is reported, not fatal: the server waits for a good
        one), then serve xDS and metrics."""
        result = await self.reloader.start()
        await self._aio_health.sync()
        await self.xds.start(self.settings.xds.host, self.settings.xds.port)
        await self.metrics.start()
        self.scraper.start()
        self.canary.start()
        self.shadow.start()
        self.dashboard.start()
        self.autoscaler.start()
        self.valley.start()
        return result

    @property
    def xds_port(self) -> int:
        return self.xds.port

    async def drain(self, timeout: float = 0.0) -> None:
        """NOT_SERVING on every health endpoint; no more reloads. xDS keeps serving until
        ``aclose`` (``timeout`` is accepted for the common drain signature)."""
        self.health.shutdown()
        await self._aio_health.sync()
        await self.reloader.aclose()

    async def aclose(self) -> None:
        await self.drain()
        await self.canary.aclose()
        await self.autoscaler.aclose()
        await self.valley.aclose()
        await self.shadow.aclose()
        await self._canary_fetcher.aclose()
        await self.scraper.aclose()
        await self.dashboard.aclose()
        await self.fetcher.aclose()
        await self.xds.aclose()
        await self.metrics.aclose()
