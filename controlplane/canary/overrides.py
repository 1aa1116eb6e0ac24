"""Canary weights the control plane has overridden (a rollback sets 0), applied to every
snapshot on its way to the cache: the policy's own render, and the EDS marks' republish.

:func:`apply_weights` is pure. :class:`OverrideCache` is the snapshot cache with the overrides
applied to whatever is set: it keeps each group's last snapshot as written and publishes it
again, rewritten, when an override changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping

from envoy.config.route.v3 import route_pb2
from google.protobuf import wrappers_pb2

from controlplane.translate.names import canary_cluster, pool_cluster
from controlplane.xds.cache import NodeGrouper, SnapshotCache, by_cluster
from controlplane.xds.snapshot import Snapshot
from controlplane.xds.types import ROUTE

__all__ = ["OverrideCache", "apply_weights"]


def apply_weights(snapshot: Snapshot, weights: Mapping[str, int]) -> Snapshot:
    """``snapshot`` with each pool's canary at ``weights[pool]`` percent in every weighted split
    (the baseline gets the rest); unchanged when no split names such a pool."""
    if not weights:
        return snapshot
    targets = {pool_cluster(p): (canary_cluster(p), w) for p, w in weights.items()}
    routes = dict(snapshot.of_type(ROUTE))
    changed = False
    for name, rcfg in routes.items():
        new = route_pb2.RouteConfiguration()
        new.CopyFrom(rcfg)
        touched = False
        for vh in new.virtual_hosts:
            for r in vh.routes:
                if not r.route.HasField("weighted_clusters"):
                    continue
                cw = r.route.weighted_clusters.clusters
                names = [c.name for c in cw]
                for base, (canary, w) in targets.items():
                    if base in names and canary in names:
                        for c in cw:
                            value = w if c.name == canary else 100 - w
                            c.weight.CopyFrom(wrappers_pb2.UInt32Value(value=value))
                        touched = True
        if touched:
            routes[name] = new
            changed = True
    if not changed:
        return snapshot
    digest = hashlib.sha256(snapshot.version.encode())
    for pool, w in sorted(weights.items()):
        digest.update(f"|canary:{pool}@{w}".encode())
    resources = {t: dict(v) for t, v in snapshot.resources.items()}
    resources[ROUTE] = routes
    return Snapshot(digest.hexdigest()[:12], resources)


class OverrideCache(SnapshotCache):
    """The snapshot cache, with canary weight overrides applied to every snapshot set."""

    def __init__(
        self, node_group: NodeGrouper = by_cluster, *, static_clusters: Collection[str] = ()
    ) -> None:
        super().__init__(node_group, static_clusters=static_clusters)
        self._base: dict[str, Snapshot] = {}
        self.weights: dict[str, int] = {}

    def set_snapshot(self, group: str, snapshot: Snapshot) -> None:
        self._base[group] = snapshot
        super().set_snapshot(group, apply_weights(snapshot, self.weights))

    def override(self, pool: str, weight: int | None) -> None:
        """Set (or with None, drop) ``pool``'s canary weight and republish every group."""
        if weight is None:
            self.weights.pop(pool, None)
        else:
            self.weights[pool] = weight
        for group, base in self._base.items():
            super().set_snapshot(group, apply_weights(base, self.weights))
