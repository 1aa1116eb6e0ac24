"""The control plane process: snapshot cache + ADS server + policy reloader + /metrics."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from controlplane.metrics_http import MetricsServer
from controlplane.policy import Address
from controlplane.reloader import Reloader, ReloadResult
from controlplane.xds.cache import SnapshotCache
from controlplane.xds.server import XdsServer

__all__ = ["ControlPlane", "ControlPlaneSettings"]


@dataclass(frozen=True)
class ControlPlaneSettings:
    policy_path: Path
    xds: Address
    metrics: Address
    debounce: float = 0.1


class ControlPlane:
    """Owns every task it starts; ``aclose`` stops them all."""

    def __init__(self, settings: ControlPlaneSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.cache = SnapshotCache()
        self.xds = XdsServer(self.cache, registry=self.registry)
        self.reloader = Reloader(
            settings.policy_path, self.cache, registry=self.registry, debounce=settings.debounce
        )
        self.metrics = MetricsServer(self.registry, settings.metrics.host, settings.metrics.port)

    async def start(self) -> ReloadResult:
        """Load the policy (a rejected file is reported, not fatal: the server waits for a good
        one), then serve xDS and metrics."""
        result = await self.reloader.start()
        await self.xds.start(self.settings.xds.host, self.settings.xds.port)
        await self.metrics.start()
        return result

    @property
    def xds_port(self) -> int:
        return self.xds.port

    async def aclose(self) -> None:
        await self.reloader.aclose()
        await self.xds.aclose()
        await self.metrics.aclose()
