"""An immutable, versioned set of Envoy resources for one node group, checked before use."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from controlplane.xds.errors import InconsistentSnapshotError
from controlplane.xds.refs import CLUSTER_REF, Reference, references
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER, ORDER, ROUTE, short_name

__all__ = ["RefsOf", "Snapshot", "resource_name", "resource_version", "type_url_of"]

RefsOf = Callable[[str, str, Message], Iterable[Reference]]

_TYPE_OF_MESSAGE = {
    cluster_pb2.Cluster.DESCRIPTOR.full_name: CLUSTER,
    endpoint_pb2.ClusterLoadAssignment.DESCRIPTOR.full_name: ENDPOINT,
    listener_pb2.Listener.DESCRIPTOR.full_name: LISTENER,
    route_pb2.RouteConfiguration.DESCRIPTOR.full_name: ROUTE,
}


def type_url_of(resource: Message) -> str:
    """The xDS type URL of a Cluster, ClusterLoadAssignment, Listener or RouteConfiguration."""
    try:
        return _TYPE_OF_MESSAGE[resource.DESCRIPTOR.full_name]
    except KeyError:
        raise TypeError(f"not an xDS resource: {resource.DESCRIPTOR.full_name}") from None


def resource_name(resource: Message) -> str:
    """The name Envoy subscribes to: ``cluster_name`` for a ClusterLoadAssignment, else ``name``."""
    if isinstance(resource, endpoint_pb2.ClusterLoadAssignment):
        return str(resource.cluster_name)
    return str(resource.name)  # type: ignore[attr-defined]  # every resource type but ClusterLoadAssignment has name; Message declares no fields


def resource_version(resource: Message) -> str:
    """A stable version of one resource: a hash of its deterministic serialization.

    Equal content gives equal versions across processes and restarts, so a restarted control
    plane recognises what a reconnecting Envoy already holds (Delta ``initial_resource_versions``).
    """
    return hashlib.sha256(resource.SerializeToString(deterministic=True)).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Everything one node group should run: type URL → resource name → resource."""

    version: str
    resources: Mapping[str, Mapping[str, Message]] = field(default_factory=dict)

    @classmethod
    def of(cls, version: str, items: Iterable[Message]) -> Snapshot:
        """Build a snapshot from resources of the four kinds, keyed by their own names."""
        grouped: dict[str, dict[str, Message]] = {type_url: {} for type_url in ORDER}
        for item in items:
            name = resource_name(item)
            bucket = grouped[type_url_of(item)]
            if name in bucket:
                raise ValueError(f"duplicate {short_name(type_url_of(item))} resource {name!r}")
            bucket[name] = item
        return cls(version, {k: MappingProxyType(v) for k, v in grouped.items()})

    def of_type(self, type_url: str) -> Mapping[str, Message]:
        return self.resources.get(type_url, MappingProxyType({}))

    @cached_property
    def versions(self) -> Mapping[str, Mapping[str, str]]:
        """type URL → resource name → :func:`resource_version` (computed once per snapshot)."""
        return MappingProxyType(
            {
                type_url: MappingProxyType(
                    {name: resource_version(res) for name, res in by_name.items()}
                )
                for type_url, by_name in self.resources.items()
            }
        )

    def packed(self, type_url: str, name: str) -> any_pb2.Any:
        """The resource packed in an ``Any``, packed once per snapshot and then reused."""
        cache = self._packed_cache
        key = (type_url, name)
        found = cache.get(key)
        if found is None:
            found = any_pb2.Any()
            found.Pack(self.of_type(type_url)[name])
            cache[key] = found
        return found

    @cached_property
    def _packed_cache(self) -> dict[tuple[str, str], any_pb2.Any]:
        return {}

    def check(self, known_clusters: Collection[str] = (), refs_of: RefsOf | None = None) -> None:
        """Raise :class:`InconsistentSnapshotError` listing every dangling reference.

        ``known_clusters`` are clusters Envoy has from elsewhere (its static bootstrap).
        ``refs_of(type_url, name, resource)`` may memoize :func:`references` (the cache does,
        by resource version); by default every resource is walked.
        """
        problems = self.problems(known_clusters, refs_of)
        if problems:
            raise InconsistentSnapshotError(self.version, problems)

    def problems(
        self, known_clusters: Collection[str] = (), refs_of: RefsOf | None = None
    ) -> list[str]:
        """Every dangling reference and misfiled resource, as readable lines."""
        problems: list[str] = []
        for type_url, by_name in self.resources.items():
            if type_url not in ORDER:
                problems.append(f"unknown resource type {type_url}")
                continue
            for name, res in by_name.items():
                if type_url_of(res) != type_url or resource_name(res) != name:
                    problems.append(
                        f"{short_name(type_url)} {name!r}: holds {res.DESCRIPTOR.name} "
                        f"{resource_name(res)!r}"
                    )
        clusters = set(self.of_type(CLUSTER)) | set(known_clusters)
        routes = set(self.of_type(ROUTE))
        problems.extend(self._missing_endpoints())
        for type_url in (CLUSTER, LISTENER, ROUTE):
            for name, res in self.of_type(type_url).items():
                found = refs_of(type_url, name, res) if refs_of else references(res)
                for ref in found:
                    known = clusters if ref.kind == CLUSTER_REF else routes
                    if ref.name not in known:
                        what = "cluster" if ref.kind == CLUSTER_REF else "route configuration"
                        problems.append(
                            f"{short_name(type_url)} {name!r}: {ref.path} names {what} "
                            f"{ref.name!r}, which the snapshot does not contain"
                        )
        return problems

    def _missing_endpoints(self) -> list[str]:
        problems = []
        assignments = self.of_type(ENDPOINT)
        for name, cluster in self.of_type(CLUSTER).items():
            assert isinstance(cluster, cluster_pb2.Cluster)
            if cluster.type != cluster_pb2.Cluster.EDS:
                continue
            wanted = cluster.eds_cluster_config.service_name or name
            if wanted not in assignments:
                problems.append(
                    f"cds {name!r}: EDS cluster needs ClusterLoadAssignment {wanted!r}, "
                    "which the snapshot does not contain"
                )
        return problems

    @cached_property
    def eds_assignments(self) -> Mapping[str, str]:
        """EDS cluster name → the ClusterLoadAssignment name it subscribes to."""
        return MappingProxyType(
            {
                name: str(cluster.eds_cluster_config.service_name or name)
                for name, cluster in self.of_type(CLUSTER).items()
                if isinstance(cluster, cluster_pb2.Cluster)
                and cluster.type == cluster_pb2.Cluster.EDS
            }
        )
