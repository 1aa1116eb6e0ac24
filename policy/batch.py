"""Policy of the batch API and its runner (batch_service/; docs/batch.md).

The API (OpenAI's ``/v1/files`` and ``/v1/batches``) is an HTTP service of the policy: the
gateway routes those paths to it like any service, behind the ``identity`` plugin (the same
tenant keys as chat traffic). ``batch.service`` names that service; ``tokenweir up`` starts one
API server on each of its endpoints. Runners (``runner.replicas``) feed the jobs' lines into
``pool`` through ``gateway``, in the batch lane, while the pool has headroom.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from policy.common import Port
from policy.decode import Duration, Range, Size

if TYPE_CHECKING:
    from policy.model import Policy, Route

__all__ = [
    "BATCH_LINE_HEADER",
    "BatchLimits",
    "BatchPolicy",
    "BatchRunner",
    "authenticates_batch_api",
    "check_batch",
]

# set by the runner on every line: the gateway's batch route matches it (lane batch, idempotency)
BATCH_LINE_HEADER = "x-batch-line"


@dataclass(frozen=True)
class BatchLimits:
    """Per tenant: files kept, their bytes together, and jobs not yet finished."""

    files: Annotated[int, Range(1, 1_000_000)] = 100
    bytes: Annotated[int, Size(1024, 1024**4)] = 1024**3
    jobs_in_flight: Annotated[int, Range(1, 10_000)] = 10


@dataclass(frozen=True)
class BatchRunner:
    """The runner processes: ``replicas`` of them (0: none, the API only); replica ``i`` serves
    /metrics on ``metrics_port + i``. Each keeps at most ``max_concurrency`` lines in flight and
    fills the pool's running slots up to ``fill`` of its capacity, counting interactive
    requests first; a line the gateway sheds (429, 503) halves the window and pauses the
    runner for ``backoff``. ``line_retries``: how often a line answered 5xx is sent again
    before it is recorded as failed; the runner pauses ``backoff``, then twice that, and so on
    (8: about 4 minutes with 1 s, longer than a restart of any part of the mesh)."""

    replicas: Annotated[int, Range(0, 16)] = 1
    metrics_port: Port = 18075
    max_concurrency: Annotated[int, Range(1, 4096)] = 64
    fill: Annotated[float, Range(0.05, 1.0)] = 0.9
    backoff: Annotated[float, Duration(0.01, 600)] = 1.0
    line_retries: Annotated[int, Range(0, 30)] = 8
    claim_idle: Annotated[float, Duration(1, 3600)] = 15.0  # a dead runner's job is taken after


@dataclass(frozen=True)
class BatchPolicy:
    """``completion_window``: how long the one window OpenAI offers (``24h``) lasts here (a
    shorter one for tests and time-scaled benchmarks). ``files_dir``: the file store (a
    directory; relative to the policy file; unset: ``batch-files`` in ``up``'s state folder)."""

    service: str
    gateway: str
    pool: str
    files_dir: str | None = None
    max_file_bytes: Annotated[int, Size(1024, 1024**4)] = 200 * 1024**2
    max_lines: Annotated[int, Range(1, 10_000_000)] = 50_000
    completion_window: Annotated[float, Duration(1, 30 * 86400)] = 86400.0
    limits: BatchLimits = field(default_factory=BatchLimits)
    runner: BatchRunner = field(default_factory=BatchRunner)


def check_batch(policy: Policy) -> Iterator[tuple[str, str]]:
    """Cross-references of the ``batch`` section (the loader's semantic checks call this)."""
    b = policy.batch
    if b is None:
        return
    svc = policy.services.get(b.service)
    if svc is None:
        yield "batch.service", f"unknown service {b.service!r}; defined: {sorted(policy.services)}"
    elif not svc.endpoints:
        yield "batch.service", "the batch API service needs endpoints (one API server on each)"
    if b.gateway not in policy.gateways:
        yield "batch.gateway", f"unknown gateway {b.gateway!r}; defined: {sorted(policy.gateways)}"
    if b.pool not in policy.pools:
        yield "batch.pool", f"unknown pool {b.pool!r}; defined: {sorted(policy.pools)}"
    routed = False
    for gname, gw in policy.gateways.items():
        for i, route in enumerate(gw.routes):
            if route.service != b.service:
                continue
            routed = routed or gname == b.gateway
            if not authenticates_batch_api(policy, route):
                # without identity nobody strips a client's x-tokenweir-tenant: any tenant's jobs
                yield (
                    f"gateways.{gname}.routes[{i}].filters",
                    "a route to the batch API needs filters: {plugins: [identity]} (with "
                    "settings: {forward_authorization: true}) so its tenant is the caller's",
                )
    gateway = policy.gateways.get(b.gateway)
    if gateway is not None and not any(_takes_lines(r, b.pool) for r in gateway.routes):
        yield (
            "batch.gateway",
            f"no route of gateway {b.gateway!r} to pool {b.pool!r} matches headers "
            f'{{{BATCH_LINE_HEADER}: "1"}} with the idempotency plugin: the runner\'s lines '
            "need it (lane: batch; docs/batch.md)",
        )
    if not routed:
        yield (
            "batch.service",
            f"no route of gateway {b.gateway!r} leads to {b.service!r}: add routes for "
            "/v1/files and /v1/batches (docs/batch.md)",
        )


def _takes_lines(route: Route, pool: str) -> bool:
    """A route for the runner's lines: to ``pool``, matching the line header, with idempotency."""
    f = route.filters
    return (
        route.pool == pool
        and route.match.headers.get(BATCH_LINE_HEADER) == "1"
        and f is not None
        and any(p.name == "idempotency" for p in f.plugins)
    )


def authenticates_batch_api(policy: Policy, route: Route) -> bool:
    """A route to the batch API's service whose filters are ``identity`` alone (request headers
    only: the tenant and, forwarded, the key; the body streams past untouched)."""
    b = policy.batch
    f = route.filters
    return (
        b is not None
        and route.service == b.service
        and f is not None
        and [p.name for p in f.plugins] == ["identity"]
        and f.plugins[0].settings.get("forward_authorization") is True  # the runner uses the key
    )
