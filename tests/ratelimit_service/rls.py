"""Builders of RateLimitRequests as Envoy 1.40 sends them (cost per descriptor)."""

from __future__ import annotations

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from google.protobuf import wrappers_pb2


def descriptor(entries: dict[str, str], hits: int | None) -> ratelimit_pb2.RateLimitDescriptor:
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[
            ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries.items()
        ]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


def llm(
    tenant: str,
    hits: int,
    *,
    phase: str = "reserve",
    rid: str = "r1",
    model: str = "big",
    lane: str = "interactive",
    domain: str = "tokenweir",
) -> rls_pb2.RateLimitRequest:
    entries = {"tenant": tenant, "model": model, "lane": lane, "request_id": rid, "phase": phase}
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor(entries, hits)])


def service(name: str, addr: str, domain: str = "tokenweir") -> rls_pb2.RateLimitRequest:
    entries = {"service": name, "remote_address": addr, "phase": "requests"}
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=[descriptor(entries, 1)])
