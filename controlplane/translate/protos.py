"""Small constructors for protobuf well-known types used all over the translation."""

from __future__ import annotations

from envoy.config.core.v3 import address_pb2, config_source_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

__all__ = ["Packed", "ads_source", "any_of", "double", "dur", "percent", "socket_address", "u32"]


# A message packed in protobuf's well-known ``Any`` (a per-route filter config, a typed_config).
Packed = any_pb2.Any


def dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def u32(value: int) -> wrappers_pb2.UInt32Value:
    return wrappers_pb2.UInt32Value(value=int(value))


def double(value: float) -> wrappers_pb2.DoubleValue:
    return wrappers_pb2.DoubleValue(value=float(value))


def percent(value: float):  # type: ignore[no-untyped-def]  # returns a message of a generated module that has no stubs
    from envoy.type.v3 import percent_pb2

    return percent_pb2.Percent(value=float(value))


def any_of(msg: Message) -> Packed:
    a = Packed()
    a.Pack(msg, deterministic=True)  # map order must not vary by process (versions)
    return a


def socket_address(host: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(
            address=host, port_value=port, protocol=address_pb2.SocketAddress.TCP
        )
    )


def ads_source() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )
