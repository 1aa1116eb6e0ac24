"""Find the names one xDS resource refers to: clusters and route configurations.

A generic walk over any protobuf message, unpacking ``google.protobuf.Any`` payloads whose type
is known to the default descriptor pool. The fields that hold references are listed in one table
(message full name → field → what it names), so a new filter or route feature is one line here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Imported for their side effect on the default descriptor pool: typed configs of these kinds
# are unpacked from ``Any`` so that the references inside them are seen.
import envoy.extensions.clusters.aggregate.v3.cluster_pb2
import envoy.extensions.filters.http.ext_proc.v3.ext_proc_pb2
import envoy.extensions.filters.http.ratelimit.v3.rate_limit_pb2
import envoy.extensions.filters.http.router.v3.router_pb2
import envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2
import envoy.extensions.filters.network.tcp_proxy.v3.tcp_proxy_pb2  # noqa: F401
from google.protobuf import any_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["CLUSTER_REF", "ROUTE_REF", "Reference", "references"]

CLUSTER_REF = "cluster"
ROUTE_REF = "route_config"

# message full name → {field name: kind of name it holds}
_REFERENCE_FIELDS: dict[str, dict[str, str]] = {
    "envoy.config.route.v3.RouteAction": {"cluster": CLUSTER_REF},
    "envoy.config.route.v3.WeightedCluster.ClusterWeight": {"name": CLUSTER_REF},
    "envoy.config.route.v3.RouteAction.RequestMirrorPolicy": {"cluster": CLUSTER_REF},
    "envoy.config.core.v3.GrpcService.EnvoyGrpc": {"cluster_name": CLUSTER_REF},
    "envoy.config.core.v3.HttpUri": {"cluster": CLUSTER_REF},
    "envoy.extensions.filters.network.http_connection_manager.v3.Rds": {
        "route_config_name": ROUTE_REF
    },
    "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy": {"cluster": CLUSTER_REF},
    "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.WeightedCluster.ClusterWeight": {
        "name": CLUSTER_REF
    },
    "envoy.extensions.clusters.aggregate.v3.ClusterConfig": {"clusters": CLUSTER_REF},
}

_ANY = any_pb2.Any.DESCRIPTOR.full_name


@dataclass(frozen=True)
class Reference:
    """``kind`` (cluster or route_config) ``name``, found at ``path`` inside a resource."""

    kind: str
    name: str
    path: str


def references(message: Message) -> Iterator[Reference]:
    """Every cluster and route-configuration name that ``message`` refers to, in field order."""
    stack: list[tuple[Message, str]] = [(message, "")]
    while stack:
        current, path = stack.pop()
        descriptor = current.DESCRIPTOR
        if descriptor.full_name == _ANY:
            inner = _unpack(current)
            if inner is not None:
                stack.append((inner, path))
            continue
        table = _REFERENCE_FIELDS.get(descriptor.full_name, {})
        holding = _holding_fields(descriptor.full_name)
        children: list[tuple[Message, str]] = []
        for field, value in current.ListFields():
            if field.name not in holding:
                continue  # nothing below this field can name a cluster or route configuration
            where = f"{path}.{field.name}" if path else field.name
            kind = table.get(field.name)
            if kind is not None:
                for name in value if field.is_repeated else [value]:
                    if name:
                        yield Reference(kind, str(name), where)
            else:
                children.extend(_children(field, value, where))
        stack.extend(reversed(children))


def _children(field: FieldDescriptor, value: Any, where: str) -> list[tuple[Message, str]]:
    entry = field.message_type
    assert entry is not None
    if entry.GetOptions().map_entry:
        if entry.fields_by_name["value"].message_type is None:
            return []
        return [(item, f"{where}[{key}]") for key, item in value.items()]
    if field.is_repeated:
        return [(item, f"{where}[{index}]") for index, item in enumerate(value)]
    return [(value, where)]


@functools.cache
def _holding_fields(full_name: str) -> frozenset[str]:
    """Fields of a message type through which a reference (or an ``Any``) can be reached.

    A pure function of the (immutable) descriptor pool, so its answers are cached: checking a
    snapshot then skips the subtrees that cannot matter, e.g. route matchers and endpoints.
    """
    root = descriptor_pool.Default().FindMessageTypeByName(full_name)
    graph = {root.full_name: root}
    frontier = [root]
    while frontier:
        for field in frontier.pop().fields:
            child = field.message_type
            if child is not None and child.full_name not in graph:
                graph[child.full_name] = child
                frontier.append(child)
    holds = {name: name in _REFERENCE_FIELDS or name == _ANY for name in graph}
    changed = True
    while changed:
        changed = False
        for name, descriptor in graph.items():
            if not holds[name] and any(
                f.message_type is not None and holds[f.message_type.full_name]
                for f in descriptor.fields
            ):
                holds[name] = changed = True
    direct = set(_REFERENCE_FIELDS.get(full_name, {}))
    return frozenset(
        direct
        | {
            f.name
            for f in root.fields
            if f.message_type is not None and holds[f.message_type.full_name]
        }
    )


def _unpack(packed: Message) -> Message | None:
    type_name = packed.type_url.rsplit("/", 1)[-1]  # type: ignore[attr-defined]  # a packed message (type_url, value); Message's stub declares neither
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(type_name)
    except KeyError:
        return None  # a type we do not know holds no reference we check
    inner = message_factory.GetMessageClass(descriptor)()
    inner.ParseFromString(packed.value)  # type: ignore[attr-defined]  # a packed message (type_url, value); Message's stub declares neither
    return inner
