"""One snapshot per node group; the reloader writes it, ADS streams wait for newer ones.

No I/O here. All methods must be called from the event loop thread that runs the ADS server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from google.protobuf.message import Message

from controlplane.xds.refs import Reference, references
from controlplane.xds.snapshot import Snapshot

__all__ = ["NodeGrouper", "SnapshotCache", "by_cluster"]

NodeGrouper = Callable[[base_pb2.Node], str]
PublishListener = Callable[[str, Snapshot], None]


def by_cluster(node: base_pb2.Node) -> str:
    """The default node → group mapping: Envoy's ``--service-cluster`` (``node.cluster``)."""
    return str(node.cluster)


_RefMemo = dict[tuple[str, str], tuple[str, tuple[Reference, ...]]]


@dataclass
class _Slot:
    snapshot: Snapshot | None
    generation: int
    changed: asyncio.Event
    # (type URL, name) → (version, references) of the last checked snapshot: unchanged
    # resources are not walked again (a 1,000-cluster check drops from ~14 ms to ~1 ms).
    refs: _RefMemo = field(default_factory=dict)


class SnapshotCache:
    """Holds the latest consistent snapshot of every node group."""

    def __init__(
        self,
        node_group: NodeGrouper = by_cluster,
        *,
        static_clusters: Collection[str] = (),
    ) -> None:
        self._node_group = node_group
        self._static_clusters = frozenset(static_clusters)
        self._slots: dict[str, _Slot] = {}
        self._listeners: list[PublishListener] = []

    def group_of(self, node: base_pb2.Node) -> str:
        return self._node_group(node)

    def check(self, group: str, snapshot: Snapshot) -> None:
        """What ``set_snapshot`` checks, without publishing (raises InconsistentSnapshotError)."""
        slot = self._slot(group)
        fresh: _RefMemo = {}

        def refs_of(type_url: str, name: str, resource: Message) -> tuple[Reference, ...]:
            version = snapshot.versions[type_url][name]
            known = slot.refs.get((type_url, name))
            found = known[1] if known and known[0] == version else tuple(references(resource))
            fresh[(type_url, name)] = (version, found)
            return found

        snapshot.check(self._static_clusters, refs_of)
        slot.refs = fresh

    def set_snapshot(self, group: str, snapshot: Snapshot) -> None:
        """Publish ``snapshot`` for ``group``; an inconsistent one raises and is not published."""
        self.check(group, snapshot)
        slot = self._slot(group)
        old_event = slot.changed
        slot.snapshot = snapshot
        slot.generation += 1
        slot.changed = asyncio.Event()
        old_event.set()
        for listener in tuple(self._listeners):
            listener(group, snapshot)

    def clear(self, group: str) -> None:
        """Forget a group's snapshot (its Envoys keep what they have; waiters keep waiting)."""
        slot = self._slots.get(group)
        if slot is not None:
            slot.snapshot = None

    def get(self, group: str) -> Snapshot | None:
        slot = self._slots.get(group)
        return slot.snapshot if slot else None

    def groups(self) -> dict[str, Snapshot]:
        return {g: s.snapshot for g, s in self._slots.items() if s.snapshot is not None}

    def generation(self, group: str) -> int:
        """How many snapshots ``group`` has seen (0: none yet)."""
        slot = self._slots.get(group)
        return slot.generation if slot else 0

    async def wait_newer(self, group: str, seen: int) -> tuple[int, Snapshot]:
        """Wait until ``group`` has a snapshot of generation above ``seen``; return both."""
        while True:
            slot = self._slot(group)
            if slot.generation > seen and slot.snapshot is not None:
                return slot.generation, slot.snapshot
            await slot.changed.wait()

    def add_listener(self, listener: PublishListener) -> None:
        """Call ``listener(group, snapshot)`` after every publication (metrics, logs)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: PublishListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _slot(self, group: str) -> _Slot:
        slot = self._slots.get(group)
        if slot is None:
            slot = _Slot(None, 0, asyncio.Event(), {})
            self._slots[group] = slot
        return slot
