from __future__ import annotations

import asyncio

import pytest

from controlplane.xds.cache import SnapshotCache
from controlplane.xds.errors import InconsistentSnapshotError
from controlplane.xds.snapshot import Snapshot
from tests.controlplane.xds import resources as r
from tests.controlplane.xds.fakes import node


def good(version: str, port: int = 8000) -> Snapshot:
    return r.snapshot(version, r.eds_cluster("a"), r.cla("a", [port]))


def test_default_group_is_node_cluster_and_mapping_is_injectable() -> None:
    assert SnapshotCache().group_of(node("x", "edge")) == "edge"
    assert SnapshotCache(lambda n: n.id.split("-")[0]).group_of(node("side-1", "c")) == "side"


def test_inconsistent_snapshot_is_never_published() -> None:
    cache = SnapshotCache()
    cache.set_snapshot("edge", good("1"))
    with pytest.raises(InconsistentSnapshotError):
        cache.set_snapshot("edge", r.snapshot("2", r.eds_cluster("a")))
    published = cache.get("edge")
    assert published is not None and published.version == "1"
    assert cache.generation("edge") == 1
    assert cache.get("other") is None


async def test_waiters_wake_on_newer_snapshot_only_of_their_group() -> None:
    cache = SnapshotCache()
    seen: list[str] = []
    cache.add_listener(lambda group, snap: seen.append(f"{group}@{snap.version}"))
    waiter = asyncio.create_task(cache.wait_newer("edge", 0))
    await asyncio.sleep(0)
    cache.set_snapshot("sidecar", good("s1"))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    cache.set_snapshot("edge", good("e1"))
    generation, snap = await asyncio.wait_for(waiter, 1)
    assert (generation, snap.version) == (1, "e1")
    # A waiter that already saw generation 1 waits for the next one.
    again = asyncio.create_task(cache.wait_newer("edge", 1))
    await asyncio.sleep(0.01)
    assert not again.done()
    cache.set_snapshot("edge", good("e2", 8001))
    assert (await asyncio.wait_for(again, 1))[1].version == "e2"
    assert seen == ["sidecar@s1", "edge@e1", "edge@e2"]


def test_static_clusters_satisfy_references() -> None:
    snap = r.snapshot(
        "1", r.listener("in", 1, "rt", ext_proc_cluster="static_proc"), r.route_config("rt", [])
    )
    with pytest.raises(InconsistentSnapshotError):
        SnapshotCache().set_snapshot("g", snap)
    SnapshotCache(static_clusters={"static_proc"}).set_snapshot("g", snap)


def test_remembered_references_still_catch_a_removed_cluster() -> None:
    """References of unchanged resources are reused, and checked against the new names."""
    cache = SnapshotCache()
    routes = r.route_config("rt", [("/a", "a"), ("/", "b")])
    both = r.snapshot(
        "1", r.eds_cluster("a"), r.cla("a", [1]), r.eds_cluster("b"), r.cla("b", [2]), routes
    )
    cache.set_snapshot("g", both)
    without_b = r.snapshot("2", r.eds_cluster("a"), r.cla("a", [1]), routes)
    with pytest.raises(InconsistentSnapshotError, match="names cluster 'b'"):
        cache.set_snapshot("g", without_b)
    cache.check("g", both)  # and the same content passes again
