"""Saturation marks → EDS: only the marked pool's assignment changes; marks survive reloads."""

from __future__ import annotations

from envoy.config.core.v3 import health_check_pb2

from controlplane.reloader import snapshots_for
from controlplane.saturation.eds import FULL_WEIGHT, EdsMarks, marks_of, ready_of, reweigh
from controlplane.translate.render import render
from controlplane.xds.cache import SnapshotCache
from controlplane.xds.snapshot import Snapshot
from controlplane.xds.types import ENDPOINT
from policy import load_policy_text
from poolstate import PoolState, ReplicaState, summarize_pool

POLICY = """
version: 1
pools:
  chat: {models: [c], endpoints: ['127.0.0.1:1', '127.0.0.1:2', '127.0.0.1:3']}
  code: {models: [k], endpoints: ['127.0.0.1:7', '127.0.0.1:8']}
gateways:
  edge:
    routes:
      - {name: chat, pool: chat, match: {model: c}}
      - {name: code, pool: code, match: {model: k}}
"""


def snapshot() -> Snapshot:
    return snapshots_for(render(load_policy_text(POLICY, "m.yaml")))["edge"]


def state(marked: dict[str, set[str]]) -> PoolState:
    pools = {
        pool: summarize_pool(
            {ep: ReplicaState(0.5, degraded=ep in marked.get(pool, set())) for ep in eps}, {}
        )
        for pool, eps in {
            "chat": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"],
            "code": ["127.0.0.1:7", "127.0.0.1:8"],
        }.items()
    }
    return PoolState(1, 0.0, pools)


def weights(snap: Snapshot, cluster: str) -> dict[int, tuple[int, int]]:
    cla = snap.of_type(ENDPOINT)[cluster]
    return {
        lb.endpoint.address.socket_address.port_value: (
            lb.load_balancing_weight.value,
            lb.health_status,
        )
        for loc in cla.endpoints  # type: ignore[attr-defined]
        for lb in loc.lb_endpoints
    }


def test_marks_of_lists_marked_replicas_per_pool() -> None:
    assert marks_of(state({"chat": {"127.0.0.1:2"}})) == {"chat": frozenset({"127.0.0.1:2"})}
    assert marks_of(state({})) == {}


def test_a_marked_replica_loses_weight_and_only_its_pools_assignment_changes() -> None:
    base = snapshot()
    new = reweigh(base, {"chat": frozenset({"127.0.0.1:2"})}, {"chat": 5})
    assert weights(new, "pool_chat") == {
        1: (FULL_WEIGHT, 0),
        2: (5, 0),
        3: (FULL_WEIGHT, 0),
    }
    changed = {
        (t, n)
        for t, by_name in new.versions.items()
        for n, v in by_name.items()
        if base.versions[t][n] != v
    }
    assert changed == {(ENDPOINT, "pool_chat")}
    assert new.version != base.version
    assert reweigh(base, {}, {}) is base


def test_a_pool_whose_every_replica_is_marked_is_left_alone() -> None:
    # all DEGRADED would empty Envoy's ring (it hashes over healthy hosts only): nothing fails
    # over to the saturated replicas, every request fails
    base = snapshot()
    both = frozenset({"127.0.0.1:7", "127.0.0.1:8"})
    assert reweigh(base, {"code": both}, {"code": 0}) is base


def test_weight_zero_marks_the_replica_degraded() -> None:
    new = reweigh(snapshot(), {"code": frozenset({"127.0.0.1:8"})}, {"code": 0})
    assert weights(new, "pool_code")[8][1] == health_check_pb2.DEGRADED
    assert weights(new, "pool_code")[7] == (FULL_WEIGHT, health_check_pb2.UNKNOWN)


def test_marks_are_published_on_change_only_and_survive_a_policy_reload() -> None:
    cache = SnapshotCache()
    eds = EdsMarks(cache)
    cache.set_snapshot("edge", eds.transform("edge", snapshot()))
    first = cache.get("edge")
    assert first is not None
    eds.on_state(state({"chat": {"127.0.0.1:3"}}))
    marked = cache.get("edge")
    assert marked is not None and marked.version != first.version
    assert weights(marked, "pool_chat")[3] == (0, health_check_pb2.DEGRADED)
    generation = cache.generation("edge")
    eds.on_state(state({"chat": {"127.0.0.1:3"}}))  # same marks: nothing published
    assert cache.generation("edge") == generation
    reloaded = eds.transform("edge", snapshot())  # the reloader renders the policy again
    assert weights(reloaded, "pool_chat")[3] == (0, health_check_pb2.DEGRADED)
    eds.on_state(state({}))  # recovered: the policy's own assignment again
    back = cache.get("edge")
    assert back is not None and back.version == first.version


def test_the_reloader_publishes_its_snapshots_through_the_transform(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client import CollectorRegistry

    from controlplane.reloader import Reloader

    path = tmp_path / "mesh.yaml"
    path.write_text(POLICY)
    cache = SnapshotCache()
    eds = EdsMarks(cache)
    eds.marks = {"chat": frozenset({"127.0.0.1:1"})}
    reloader = Reloader(path, cache, registry=CollectorRegistry(), transform=eds.transform)
    assert reloader.reload().ok
    published = cache.get("edge")
    assert published is not None
    assert weights(published, "pool_chat")[1] == (0, health_check_pb2.DEGRADED)


def test_no_mark_spills_only_to_a_replica_not_seen_serving() -> None:
    """A replica just added (not yet scraped: Envoy may not have health-checked it either) is no
    place to spill to: marking the only one that serves DEGRADED would leave no host to route to
    (the ramp bench's 503 ``no healthy upstream`` while a scale-up's replica came in)."""
    base = snapshot()
    marks = {"code": frozenset({"127.0.0.1:7"})}
    # the pool state has seen only :7 (saturated); :8 was just added to the endpoints
    seen = PoolState(1, 0.0, {"code": summarize_pool(
        {"127.0.0.1:7": ReplicaState(0.9, degraded=True)}, {})})  # fmt: skip
    assert ready_of(seen) == {"code": frozenset()}
    assert reweigh(base, marks, {}, ready_of(seen)) is base  # :7 stays in the ring
    assert weights(reweigh(base, marks, {}), "pool_code")[7][1] == health_check_pb2.DEGRADED
    # once :8 answers a scrape, the mark applies; EdsMarks republishes when the ready set moves
    cache = SnapshotCache()
    eds = EdsMarks(cache)
    cache.set_snapshot("edge", eds.transform("edge", base))
    eds.on_state(seen)
    held = cache.get("edge")
    assert held is not None and weights(held, "pool_code")[7][1] == 0
    both = PoolState(1, 0.0, {"code": summarize_pool(
        {"127.0.0.1:7": ReplicaState(0.9, degraded=True), "127.0.0.1:8": ReplicaState(0.1)},
        {})})  # fmt: skip
    eds.on_state(both)
    snap = cache.get("edge")
    assert snap is not None and weights(snap, "pool_code")[7][1] == health_check_pb2.DEGRADED
