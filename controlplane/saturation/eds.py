"""Saturation → EDS: a marked (saturated) replica is sent as ``health_status: DEGRADED`` (the
default) or keeps ``degraded_weight`` percent of its ring-hash weight, so new sessions spill
past it.

Envoy builds a priority's hash ring from its *healthy* hosts only (``normalizeWeights`` in
``thread_aware_lb_impl.cc``), so a DEGRADED host leaves the ring as if removed: its sessions go
to the next points, the others' shares grow from 1/3 to 1/2, and ~7% of the other replicas'
sessions move too (DESIGN.md fact 9); when it recovers the ring, and every mapping, is restored
exactly. A lower weight keeps the host on the ring with a prefix of its points, but the others'
shares still grow (the ring is normalized), and measured on real Envoy small weights move *more*
of the others' sessions than removal (weight 1: 16%). docs/operations.md has the numbers.
If every endpoint of a pool is marked, none is: all-DEGRADED would leave the ring empty. Nor
where the only unmarked endpoints are ones the pool state has not seen serve (a replica the
autoscaler just added: Envoy has not health-checked it yet, so it is not in the ring either;
marking the rest DEGRADED answered a request ``503 no healthy upstream`` in the ramp bench).

Pure parts: :func:`marks_of` and :func:`reweigh`. :class:`EdsMarks` holds the current marks,
rewrites the reloader's snapshots (its ``transform``) and republishes when a mark flips; only
the ClusterLoadAssignments of pools whose marks changed get new resource versions.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping

from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from google.protobuf import wrappers_pb2
from prometheus_client import CollectorRegistry, Counter

from controlplane.translate.names import pool_cluster
from controlplane.xds.cache import SnapshotCache
from controlplane.xds.snapshot import Snapshot
from controlplane.xds.types import ENDPOINT
from poolstate import PoolState

__all__ = ["FULL_WEIGHT", "EdsMarks", "marks_of", "ready_of", "reweigh"]

log = logging.getLogger("tokenweir.saturation")

FULL_WEIGHT = 100
Marks = Mapping[str, frozenset[str]]  # pool → marked endpoints ("host:port")


def marks_of(state: PoolState) -> dict[str, frozenset[str]]:
    """Pure: the replicas each pool has marked saturated (pools without any are left out)."""
    out = {}
    for pool, summary in state.pools.items():
        marked = frozenset(ep for ep, r in summary.endpoints.items() if r.degraded)
        if marked:
            out[pool] = marked
    return out


def ready_of(state: PoolState) -> dict[str, frozenset[str]]:
    """Pure: per pool, the replicas that can take what a mark spills: answered the last scrape,
    fresh and unmarked."""
    return {
        pool: frozenset(
            ep
            for ep, r in summary.endpoints.items()
            if r.healthy and not r.stale and not r.degraded
        )
        for pool, summary in state.pools.items()
    }


def _address(lb: endpoint_components_pb2.LbEndpoint) -> str:
    sa = lb.endpoint.address.socket_address
    return f"{sa.address}:{sa.port_value}"


def reweigh(
    snapshot: Snapshot, marks: Marks, weights: Mapping[str, int], ready: Marks | None = None
) -> Snapshot:
    """Pure: ``snapshot`` with every marked endpoint at ``weights[pool]`` percent (default 0:
    ``DEGRADED`` instead of a weight) and its pool's other endpoints at :data:`FULL_WEIGHT`;
    unmarked pools, and pools whose every endpoint is marked, are untouched; so are pools none
    of whose unmarked endpoints is in ``ready`` (where it names the pool: those seen
    serving)."""
    if not marks:
        return snapshot
    cla = dict(snapshot.of_type(ENDPOINT))
    changed = False
    for pool, marked in sorted(marks.items()):
        name = pool_cluster(pool)
        if name not in cla:
            continue
        new = endpoint_pb2.ClusterLoadAssignment()
        new.CopyFrom(cla[name])
        hosts = {_address(lb) for loc in new.endpoints for lb in loc.lb_endpoints}
        if hosts <= marked:
            continue  # nowhere to spill: all-DEGRADED would leave Envoy's ring empty
        if ready is not None and pool in ready and not (hosts - marked) & ready[pool]:
            continue  # only to replicas not seen serving yet, which Envoy may not route to
        for locality in new.endpoints:
            for lb in locality.lb_endpoints:
                w = weights.get(pool, 0) if _address(lb) in marked else FULL_WEIGHT
                if w == 0:
                    lb.health_status = health_check_pb2.DEGRADED
                else:
                    lb.load_balancing_weight.CopyFrom(wrappers_pb2.UInt32Value(value=w))
        cla[name] = new
        changed = True
    if not changed:
        return snapshot
    digest = hashlib.sha256(snapshot.version.encode())
    for pool, marked in sorted(marks.items()):
        digest.update(f"|{pool}:{','.join(sorted(marked))}@{weights.get(pool, 0)}".encode())
    resources = {t: dict(v) for t, v in snapshot.resources.items()}
    resources[ENDPOINT] = cla
    return Snapshot(digest.hexdigest()[:12], resources)


class EdsMarks:
    """The saturation marks Envoy sees. ``transform`` goes to the reloader; ``on_state`` is a
    pool scraper listener. Both run on the event loop thread that runs the ADS server."""

    def __init__(self, cache: SnapshotCache, *, registry: CollectorRegistry | None = None) -> None:
        self._cache = cache
        self.marks: dict[str, frozenset[str]] = {}
        self.ready: dict[str, frozenset[str]] = {}  # pool → replicas seen serving, unmarked
        self.weights: dict[str, int] = {}
        self._base: dict[str, Snapshot] = {}  # each group's snapshot as the policy renders it
        self._flips = (
            Counter(
                "tokenweir_eds_saturation_marks",
                "Replicas marked (mark) or unmarked (clear) saturated in EDS",
                ["pool", "change"],
                registry=registry,
            )
            if registry is not None
            else None
        )

    def transform(self, group: str, snapshot: Snapshot) -> Snapshot:
        """The reloader's snapshot for ``group`` with the current marks applied."""
        self._base[group] = snapshot
        return reweigh(snapshot, self.marks, self.weights, self.ready)

    def set_weights(self, weights: Mapping[str, int]) -> None:
        """The policy's ``degraded_weight`` per pool; republishes if marks are in force."""
        if dict(weights) != self.weights:
            self.weights = dict(weights)
            self._publish()

    def on_state(self, state: PoolState) -> None:
        marks, ready = marks_of(state), ready_of(state)
        if marks == self.marks:
            if ready != self.ready:  # a replica began (or ceased) to serve: where to spill
                self.ready = ready
                if marks:
                    self._publish()
            return
        self.ready = ready
        for pool in sorted(set(marks) | set(self.marks)):
            now, before = marks.get(pool, frozenset()), self.marks.get(pool, frozenset())
            for ep in sorted(now - before):
                log.warning("pool %s: %s saturated; EDS weight lowered", pool, ep)
                self._count(pool, "mark")
            for ep in sorted(before - now):
                log.info("pool %s: %s recovered; EDS weight restored", pool, ep)
                self._count(pool, "clear")
        self.marks = marks
        self._publish()

    def _publish(self) -> None:
        for group, base in self._base.items():
            snap = reweigh(base, self.marks, self.weights, self.ready)
            current = self._cache.get(group)
            if current is None or current.version != snap.version:
                self._cache.set_snapshot(group, snap)

    def _count(self, pool: str, change: str) -> None:
        if self._flips is not None:
            self._flips.labels(pool, change).inc()
