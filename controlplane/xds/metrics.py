"""Prometheus metrics of the ADS server, registered on an injected registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from controlplane.xds.snapshot import Snapshot
from controlplane.xds.types import short_name

__all__ = ["XdsMetrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 15.0)


class XdsMetrics:
    """Counters and gauges of the ADS server; also the ``Recorder`` its sessions report to."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.connected = Gauge(
            "tokenweir_xds_connected_nodes",
            "Envoy ADS streams open now, by node group and protocol variant",
            ["group", "mode"],
            registry=registry,
        )
        self.pushes = Counter(
            "tokenweir_xds_pushes",
            "xDS responses sent, by resource type",
            ["type", "mode"],
            registry=registry,
        )
        self.acks = Counter(
            "tokenweir_xds_acks",
            "xDS responses Envoy accepted",
            ["type", "mode"],
            registry=registry,
        )
        self.nacks = Counter(
            "tokenweir_xds_nacks",
            "xDS responses Envoy rejected",
            ["type", "mode"],
            registry=registry,
        )
        self.stale_nonces = Counter(
            "tokenweir_xds_stale_nonces",
            "Requests ignored because they answered an older response",
            ["type", "mode"],
            registry=registry,
        )
        self.ack_latency = Histogram(
            "tokenweir_xds_push_ack_seconds",
            "Time from sending an xDS response to Envoy's ACK",
            ["type", "mode"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.snapshot = Info(
            "tokenweir_xds_snapshot",
            "Version of the snapshot published for each node group",
            ["group"],
            registry=registry,
        )
        self.snapshot_resources = Gauge(
            "tokenweir_xds_snapshot_resources",
            "Resources in the published snapshot, by node group and type",
            ["group", "type"],
            registry=registry,
        )

    def pushed(self, type_url: str, mode: str) -> None:
        self.pushes.labels(short_name(type_url), mode).inc()

    def acked(self, type_url: str, mode: str, seconds: float) -> None:
        self.acks.labels(short_name(type_url), mode).inc()
        self.ack_latency.labels(short_name(type_url), mode).observe(seconds)

    def nacked(self, type_url: str, mode: str) -> None:
        self.nacks.labels(short_name(type_url), mode).inc()

    def stale(self, type_url: str, mode: str) -> None:
        self.stale_nonces.labels(short_name(type_url), mode).inc()

    def published(self, group: str, snapshot: Snapshot) -> None:
        self.snapshot.labels(group).info({"version": snapshot.version})
        for type_url, by_name in snapshot.resources.items():
            self.snapshot_resources.labels(group, short_name(type_url)).set(len(by_name))
