"""What Envoy asked: a RateLimitRequest turned into typed calls (see docs/quotas.md).

Envoy 1.40 sends the cost per descriptor (``descriptors[i].hits_addend``); the request-level
``hits_addend`` stays 0 (DESIGN.md facts 1–3). One descriptor is one call.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.service.ratelimit.v3 import rls_pb2

from ratelimit_service.errors import BadRequest
from wire.contract import (
    KEY_LANE,
    KEY_MODEL,
    KEY_PHASE,
    KEY_REMOTE_ADDRESS,
    KEY_REQUEST_ID,
    KEY_ROUTE,
    KEY_SERVICE,
    KEY_TENANT,
    KEY_USD,
    PHASE_REQUESTS,
    PHASE_RESERVE,
    PHASE_SETTLE,
)

__all__ = ["MAX_HITS", "Call", "parse_request"]

MAX_HITS = 100_000_000  # more tokens than any one request can cost: Envoy or a header is broken
PHASES = frozenset({PHASE_RESERVE, PHASE_SETTLE, PHASE_REQUESTS})


@dataclass(frozen=True, slots=True)
class Call:
    """``phase`` reserve/settle (an LLM tenant, ``hits`` tokens) or requests (a service)."""

    phase: str
    hits: int
    tenant: str | None = None
    model: str | None = None
    lane: str | None = None
    request_id: str | None = None
    service: str | None = None
    remote_address: str | None = None
    usd: int | None = None  # settle: the real price in micro-USD (entry ``usd``; "-" = unknown)
    route: str | None = None  # a route that pays a price factor (batch lines; entry ``route``)


def _call(entries: dict[str, str], hits: int) -> Call:
    phase = entries.get(KEY_PHASE) or (PHASE_REQUESTS if KEY_SERVICE in entries else PHASE_RESERVE)
    if phase not in PHASES:
        raise BadRequest(f"unknown phase {phase!r}; expected one of {sorted(PHASES)}")
    if hits < 0 or hits > MAX_HITS:
        raise BadRequest(f"hits_addend {hits} is outside 0..{MAX_HITS}", "invalid_hits_addend")
    if phase == PHASE_REQUESTS:
        service = entries.get(KEY_SERVICE)
        if not service:
            raise BadRequest("a request-count descriptor needs a 'service' entry")
        return Call(
            PHASE_REQUESTS, 1, service=service, remote_address=entries.get(KEY_REMOTE_ADDRESS)
        )
    tenant = entries.get(KEY_TENANT)
    if not tenant:
        raise BadRequest(f"a {phase} descriptor needs a 'tenant' entry", "missing_tenant")
    return Call(
        phase,
        hits,
        tenant=tenant,
        model=entries.get(KEY_MODEL) or None,
        lane=entries.get(KEY_LANE) or None,
        request_id=entries.get(KEY_REQUEST_ID) or None,
        usd=_micro_usd(entries.get(KEY_USD)),
        route=entries.get(KEY_ROUTE) or None,
    )


def _micro_usd(text: str | None) -> int | None:
    """The ``usd`` entry (micro-USD) the settle descriptor carries; None when absent or "-"."""
    if not text or not text.isdigit():
        return None
    return min(int(text), MAX_HITS * 1000)


def parse_request(request: rls_pb2.RateLimitRequest, domain: str) -> list[Call]:
    """Typed calls of a ``RateLimitRequest``; raises BadRequest for anything we cannot judge."""
    if request.domain != domain:
        raise BadRequest(
            f"unknown domain {request.domain!r}; this service serves {domain!r}", "unknown_domain"
        )
    if not request.descriptors:
        raise BadRequest("the request has no descriptors", "missing_descriptors")
    default_hits = request.hits_addend or 1
    calls = []
    for d in request.descriptors:
        if not d.entries:
            raise BadRequest("a descriptor has no entries", "missing_descriptors")
        entries = {e.key: e.value for e in d.entries}
        hits = d.hits_addend.value if d.HasField("hits_addend") else default_hits
        calls.append(_call(entries, hits))
    return calls
