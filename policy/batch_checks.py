"""The ``batch`` section's cross-references (the loader's semantic checks call these; kept apart
from :mod:`policy.batch`, which :mod:`policy.model` imports)."""

from __future__ import annotations

from collections.abc import Iterator

from policy.batch import BATCH_LINE_HEADER
from policy.model import Policy, Route

__all__ = ["authenticates_batch_api", "batch_line_routes", "check_batch"]


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


def batch_line_routes(policy: Policy) -> frozenset[str]:
    """The names of ``batch.gateway``'s routes that take the runner's lines (they pay the
    batch price: ``batch.price_factor``)."""
    b = policy.batch
    gw = policy.gateways.get(b.gateway) if b is not None else None
    if b is None or gw is None:
        return frozenset()
    return frozenset(r.name for r in gw.routes if _takes_lines(r, b.pool))


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
