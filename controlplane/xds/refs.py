"""Find the names one xDS resource refers to: clusters and route configurations.

A generic walk over any protobuf message, unpacking ``google.protobuf.Any`` payloads whose type
is known to the default descriptor pool. The fields that hold references are listed in one table
(message full name → field → what it names), so a new filter or route feature is one line here.
"""

from __future__ import annotations

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
    """Every cluster and route-configuration name that ``message`` refers to."""
    yield from _walk(message, "")


def _walk(message: Message, path: str) -> Iterator[Reference]:
    descriptor = message.DESCRIPTOR
    if descriptor.full_name == _ANY:
        inner = _unpack(message)
        if inner is not None:
            yield from _walk(inner, path)
        return
    table = _REFERENCE_FIELDS.get(descriptor.full_name, {})
    for field, value in message.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        kind = table.get(field.name)
        if kind is not None:
            names = value if _is_repeated(field) else [value]
            for name in names:
                if name:
                    yield Reference(kind, str(name), where)
            continue
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        yield from _walk_value(field, value, where)


def _walk_value(field: FieldDescriptor, value: Any, where: str) -> Iterator[Reference]:
    entry = field.message_type
    assert entry is not None
    if entry.GetOptions().map_entry:
        value_field = entry.fields_by_name["value"]
        if value_field.type == FieldDescriptor.TYPE_MESSAGE:
            for key, item in value.items():
                yield from _walk(item, f"{where}[{key}]")
    elif _is_repeated(field):
        for index, item in enumerate(value):
            yield from _walk(item, f"{where}[{index}]")
    else:
        yield from _walk(value, where)


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _unpack(packed: Message) -> Message | None:
    type_name = packed.type_url.rsplit("/", 1)[-1]  # type: ignore[attr-defined]
    try:
        descriptor = descriptor_pool.Default().FindMessageTypeByName(type_name)
    except KeyError:
        return None  # a type we do not know holds no reference we check
    inner = message_factory.GetMessageClass(descriptor)()
    inner.ParseFromString(packed.value)  # type: ignore[attr-defined]
    return inner
