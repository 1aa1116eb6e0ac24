"""Policy of safe retries: idempotency keys and request collapsing (filters/plugins/idempotency,
filters/plugins/collapse; docs/policy.md "Idempotency keys", "Request collapsing").

Both are opt-in per route: a route gets them by listing the ``idempotency`` or ``collapse``
plugin in its filter chain; these sections hold the knobs every such route shares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from policy.decode import Duration, Range, Size
from wire.contract import HEADER_PREFIX

__all__ = ["CollapsingPolicy", "IdempotencyPolicy", "RouteShadow"]

_HEADER = re.compile(r"^[a-z0-9][a-z0-9\-]{0,62}$")


@dataclass(frozen=True)
class IdempotencyPolicy:
    """``Idempotency-Key`` handling (IETF httpapi draft "The Idempotency-Key HTTP Header Field").

    ``ttl``: how long a finished answer is kept and replayed. ``inflight_ttl``: how long a claim
    of a request still running holds: at most as long as its backend request can run.
    ``lease``: how long a claim outlives the last heartbeat of the filter server that holds it
    (it renews it every ``lease / 3`` while the request runs); a request with the key after
    that aborts the dead holder's backend request (SGLang's ``/abort_request`` by its ``rid``,
    at every replica of the pool) and then runs in its place (docs/batch.md).
    ``max_response_bytes``: the largest answer stored; a larger one is remembered as finished
    (a retry gets 409 ``idempotency_answer_not_stored``, never a second run). ``max_key_length``:
    longer keys are refused (400). ``require``: refuse requests without a key (400).
    ``retry_after``: the ``Retry-After`` of a 409 for a request still in flight.
    ``on_store_error``: what a request with a key gets while Redis fails: ``run`` (served
    without the guarantee, counted) or ``reject`` (503 with ``Retry-After``).
    """

    header: str = "idempotency-key"
    ttl: Annotated[float, Duration(1, 7 * 86400)] = 86400.0
    inflight_ttl: Annotated[float, Duration(1, 86400)] = 600.0
    lease: Annotated[float, Duration(0.3, 3600)] = 10.0
    max_response_bytes: Annotated[int, Size(1024, 64 * 1024**2)] = 1024**2
    max_key_length: Annotated[int, Range(8, 1024)] = 255
    require: bool = False
    retry_after: Annotated[float, Duration(0.001, 3600)] = 1.0
    on_store_error: Literal["run", "reject"] = "run"

    def __post_init__(self) -> None:
        if self.lease > self.inflight_ttl:
            raise ValueError(
                f"lease ({self.lease:g}s) must be at most inflight_ttl ({self.inflight_ttl:g}s): "
                "a claim lives no longer than inflight_ttl; set a shorter idempotency.lease"
            )
        if not _HEADER.match(self.header):
            raise ValueError(
                f"header {self.header!r}: a lower-case header name (letters, digits, '-') is "
                "allowed"
            )
        if self.header.startswith(HEADER_PREFIX):
            raise ValueError("header: x-tokenweir-* headers are internal and stripped")


@dataclass(frozen=True)
class CollapsingPolicy:
    """Request collapsing: identical deterministic requests in flight share one backend run.

    ``share_across_tenants``: collapse identical requests of different tenants too (off: only
    one tenant's own requests collapse). ``max_followers``: callers one backend run may feed.
    ``max_buffer_bytes``: the leader's answer kept for followers that join late; past it no
    new follower joins (those already attached keep receiving).
    ``follower_timeout``: the longest a follower's stream may go without a chunk from the
    leader before it is ended with an error event.
    """

    share_across_tenants: bool = False
    max_followers: Annotated[int, Range(1, 10_000)] = 64
    max_buffer_bytes: Annotated[int, Size(1024, 256 * 1024**2)] = 4 * 1024**2
    follower_timeout: Annotated[float, Duration(0.1, 3600)] = 60.0


@dataclass(frozen=True)
class RouteShadow:
    """Mirror ``fraction`` of a pool route's requests to the pool ``pool`` (Envoy
    ``request_mirror_policies``): the shadow's answers are discarded, never charged, and never
    wait the primary; the control plane compares the two pools (``GET /api/v1/shadow``).

    With the ``shadow`` plugin in the route's chain the filter server samples instead of Envoy
    and each mirror passes through its shadow recorder, which compares it with its primary
    request by request (``tokenweir shadow``): ``timeout`` is the longest a shadow answer may
    take (past it, a shadow error), ``max_inflight`` the shadow requests one filter process
    carries at once (more are dropped and counted as shadow errors), ``keep`` the pairs kept
    per route in Redis (the newest; for ``ttl``).
    """

    pool: str
    fraction: Annotated[float, Range(0.0, 1.0)] = 0.1
    timeout: Annotated[float, Duration(0.1, 3600)] = 60.0
    max_inflight: Annotated[int, Range(1, 10_000)] = 64
    keep: Annotated[int, Range(1, 100_000)] = 1000
    ttl: Annotated[float, Duration(1, 30 * 86400)] = 86400.0
