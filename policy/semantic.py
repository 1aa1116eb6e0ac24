"""Cross-reference checks on a decoded policy: every name used is defined, ports do not clash.

Each check yields (key path, message); the loader turns paths into file lines.
"""

from __future__ import annotations

from collections.abc import Iterator

from policy.autoscale import autoscale_issues
from policy.batch_checks import authenticates_batch_api, check_batch
from policy.common import check_name
from policy.model import LANES, Address, LlmPool, Policy
from policy.phases import uses_collapse
from policy.ports import port_clashes, port_plan

__all__ = ["check_policy"]


def check_policy(policy: Policy) -> list[tuple[str, str]]:
    """Every cross-reference problem in ``policy`` as ``(key.path, message)``."""
    return [
        *_names(policy),
        *_pools(policy),
        *_gateways(policy),
        *_sidecars(policy),
        *_tenants(policy),
        *_prices(policy),
        *_ports(policy),
        *check_batch(policy),
    ]


def _names(policy: Policy) -> Iterator[tuple[str, str]]:
    for section in ("pools", "services", "gateways", "sidecars", "tiers", "tenants"):
        for name in getattr(policy, section):
            try:
                check_name(name, section[:-1])
            except ValueError as exc:
                yield f"{section}.{name}", str(exc)
    clash = set(policy.pools) & set(policy.services)
    for name in sorted(clash):
        yield f"services.{name}", "a pool and a service may not share a name (both become clusters)"
    clash = set(policy.gateways) & set(policy.sidecars)
    for name in sorted(clash):
        yield f"sidecars.{name}", "a gateway and a sidecar may not share a name (node cluster ids)"


def _pools(policy: Policy) -> Iterator[tuple[str, str]]:
    for name, pool in policy.pools.items():
        path = f"pools.{name}"
        if not pool.models:
            yield f"{path}.models", "list at least one model name this pool serves"
        if pool.emulated is not None and pool.emulated.base_port is None:
            yield (
                f"{path}.emulated.base_port",
                "required: emulated replicas listen on base_port, base_port+1, ...",
            )
        if pool.fallback is not None:
            if pool.fallback not in policy.pools:
                yield (
                    f"{path}.fallback",
                    f"unknown pool {pool.fallback!r}; defined pools: {sorted(policy.pools)}",
                )
            elif pool.fallback == name:
                yield f"{path}.fallback", "a pool cannot be its own fallback"
        yield from _ladder(policy, pool, path)
        yield from _routing(policy, name, pool, path)
        yield from _canary(policy, name, pool)
        if pool.autoscale is not None:
            em = pool.emulated is not None
            yield from autoscale_issues(
                path, pool.autoscale, emulated=em, endpoints_file=pool.endpoints_file
            )
        seen: set[Address] = set()
        for i, ep in enumerate(pool.endpoints):
            if ep in seen:
                yield f"{path}.endpoints[{i}]", f"duplicate endpoint {ep}"
            seen.add(ep)


def _routing(policy: Policy, name: str, pool: LlmPool, path: str) -> Iterator[tuple[str, str]]:
    if pool.routing.mode != "prefix_index":
        return
    picked = any(
        r.pool == name
        and r.filters is not None
        and r.filters.enabled
        and any(p.name == "picker" for p in r.filters.plugins)
        for g in policy.gateways.values()
        for r in g.routes
    )
    if not picked:
        yield (
            f"{path}.routing.mode",
            "prefix_index needs a gateway route to this pool whose filters run the 'picker' "
            "plugin (after 'tokens'); else use ring_hash",
        )
    if pool.affinity.prefix_tokens % pool.routing.page_size:
        yield (
            f"{path}.routing.page_size",
            f"must divide affinity.prefix_tokens ({pool.affinity.prefix_tokens})",
        )


def _canary(policy: Policy, name: str, pool: LlmPool) -> Iterator[tuple[str, str]]:
    c = pool.canary
    if c is None:
        return
    path = f"pools.{name}.canary"
    if pool.fallback is not None:
        yield f"{path}", "a pool with a fallback cannot carry a canary (one or the other)"
    both = set(c.endpoints) & set(pool.endpoints)
    if both:
        yield f"{path}.endpoints", f"{sorted(map(str, both))} also serve the baseline"
    for i, t in enumerate(c.force_tenants):
        if t not in policy.tenants:
            yield f"{path}.force_tenants[{i}]", f"unknown tenant {t!r}"


def _ladder(policy: Policy, pool: LlmPool, path: str) -> Iterator[tuple[str, str]]:
    if pool.degradation is None:
        return
    for i, step in enumerate(pool.degradation.steps):
        spath = f"{path}.degradation.steps[{i}]"
        if step.action == "fallback" and pool.fallback is None:
            yield f"{spath}.action", "a fallback step needs the pool's fallback pool"
        for tier in step.tiers:
            if tier not in policy.tiers:
                yield (
                    f"{spath}.tiers",
                    f"unknown tier {tier!r}; defined tiers: {sorted(policy.tiers)}",
                )


def _gateways(policy: Policy) -> Iterator[tuple[str, str]]:
    served = {m for p in policy.pools.values() for m in p.models}
    for gname, gw in policy.gateways.items():
        names: set[str] = set()
        for i, route in enumerate(gw.routes):
            path = f"gateways.{gname}.routes[{i}]"
            if route.name in names:
                yield f"{path}.name", f"duplicate route name {route.name!r}"
            names.add(route.name)
            if route.pool is not None and route.pool not in policy.pools:
                yield (
                    f"{path}.pool",
                    f"unknown pool {route.pool!r}; defined pools: {sorted(policy.pools)}",
                )
            if route.service is not None and route.service not in policy.services:
                yield (
                    f"{path}.service",
                    f"unknown service {route.service!r}; defined services: {sorted(policy.services)}",
                )
            if route.match.model is not None and route.match.model not in served:
                yield f"{path}.match.model", f"no pool serves model {route.match.model!r}"
            rl_on = route.rate_limit is not None and route.rate_limit.enabled
            if rl_on and policy.ratelimit is None:
                yield (
                    f"{path}.rate_limit",
                    "needs a top-level 'ratelimit:' section (where the service listens)",
                )
            filters_on = route.filters is not None and route.filters.enabled
            if route.pool is not None and rl_on and not filters_on:
                yield (
                    f"{path}.rate_limit",
                    "token limits on a pool route need its filters enabled: the filter chain "
                    "sets the x-tokenweir-* headers the limits read (without it clients would set them)",
                )
            if route.filters is not None and route.filters.enabled and policy.filters is None:
                yield (
                    f"{path}.filters",
                    "needs a top-level 'filters:' section (where the filter server listens)",
                )
            if (
                route.service is not None
                and route.filters is not None
                and route.filters.enabled
                and not authenticates_batch_api(policy, route)
            ):
                yield (
                    f"{path}.filters",
                    "LLM filters apply to pool routes only; services pass through unchanged "
                    "(the batch API's service takes [identity] alone)",
                )
            if route.shadow is not None:
                if route.pool is None:
                    yield f"{path}.shadow", "only pool routes can mirror to a shadow pool"
                elif route.shadow.pool not in policy.pools:
                    yield (
                        f"{path}.shadow.pool",
                        f"unknown pool {route.shadow.pool!r}; defined pools: {sorted(policy.pools)}",
                    )
                elif route.shadow.pool == route.pool:
                    yield f"{path}.shadow.pool", "a route cannot mirror to its own pool"
            f = route.filters
            if uses_collapse(route) and f is not None and not rl_on and f.failure_mode != "closed":
                yield (
                    f"{path}.filters.failure_mode",
                    "the collapse plugin needs failure_mode: closed (an open route would let "
                    "a client name the collapse target itself)",
                )
            ranked = route.pool in policy.pools and policy.pools[route.pool].priority_scheduling
            plugins = [p.name for p in f.plugins] if f is not None and f.enabled else []
            if ranked and ranked.enabled and "admission" in plugins and "tokens" not in plugins:
                yield (
                    f"{path}.filters.plugins",
                    f"pool {route.pool!r} schedules by priority and admission lets its higher "
                    "lanes past the lower lanes' slots: the route needs the tokens plugin, which "
                    "writes each request's priority (without it interactive would queue behind "
                    "batch in the backend)",
                )
            if f is not None and f.enabled and any(p.name == "shadow" for p in f.plugins):
                if route.shadow is None:
                    yield (
                        f"{path}.filters.plugins",
                        "the shadow plugin needs the route's 'shadow:' section (the pool it "
                        "mirrors to)",
                    )
                elif not rl_on and f.failure_mode != "closed":
                    yield (
                        f"{path}.filters.failure_mode",
                        "the shadow plugin needs failure_mode: closed (an open route would let "
                        "a client name the mirror's cluster itself)",
                    )


def _sidecars(policy: Policy) -> Iterator[tuple[str, str]]:
    for sname, sc in policy.sidecars.items():
        path = f"sidecars.{sname}"
        if sc.service not in policy.services:
            yield (
                f"{path}.service",
                f"unknown service {sc.service!r}; defined services: {sorted(policy.services)}",
            )
        if sc.inbound is None and sc.outbound is None:
            yield path, "a sidecar needs an inbound or an outbound listener (or both)"
        if sc.outbound is not None:
            for i, up in enumerate(sc.outbound.upstreams):
                if up not in policy.services and up not in policy.pools:
                    yield (
                        f"{path}.outbound.upstreams[{i}]",
                        f"unknown upstream {up!r}; it must name a service or a pool",
                    )


def _prices(policy: Policy) -> Iterator[tuple[str, str]]:
    served = sorted({m for p in policy.pools.values() for m in p.models})
    for model in policy.prices:
        if model not in served:
            yield (
                f"prices.{model}",
                f"no pool serves model {model!r}; prices are for the models pools serve: {served}",
            )
    for tname, t in policy.tenants.items():
        if t.cost_center is not None:
            try:
                check_name(t.cost_center, "cost center")
            except ValueError as exc:
                yield f"tenants.{tname}.cost_center", str(exc)


def _tenants(policy: Policy) -> Iterator[tuple[str, str]]:
    served = {m for p in policy.pools.values() for m in p.models}
    for tname, tier in policy.tiers.items():
        if tier.lane not in tier.allowed_lanes:
            yield (
                f"tiers.{tname}.lane",
                f"default lane {tier.lane!r} is not in allowed_lanes {list(tier.allowed_lanes)}",
            )
        for model in tier.quotas.models:
            if model not in served:
                yield f"tiers.{tname}.quotas.models.{model}", f"no pool serves model {model!r}"
    for tname in policy.admission.tier_weights:
        if tname not in policy.tiers:
            yield (
                f"admission.tier_weights.{tname}",
                f"unknown tier {tname!r}; defined tiers: {sorted(policy.tiers)}",
            )
    keys: dict[str, str] = {}
    for tname, tenant in policy.tenants.items():
        path = f"tenants.{tname}"
        if tenant.tier not in policy.tiers:
            yield (
                f"{path}.tier",
                f"unknown tier {tenant.tier!r}; defined tiers: {sorted(policy.tiers)}",
            )
        for i, key in enumerate(tenant.api_keys):
            if len(key) < 8:
                yield f"{path}.api_keys[{i}]", "an API key must be at least 8 characters"
            if key in keys:
                yield f"{path}.api_keys[{i}]", f"this key is already given to tenant {keys[key]!r}"
            keys.setdefault(key, tname)
        if tenant.quotas is not None:
            for lane in tenant.quotas.lanes:
                if lane not in LANES:
                    yield f"{path}.quotas.lanes.{lane}", f"unknown lane; allowed: {list(LANES)}"


def _ports(policy: Policy) -> Iterator[tuple[str, str]]:
    """No port claimed twice (policy.ports: the same check ``up --replicas`` runs)."""
    for clash in port_clashes(port_plan(policy)):
        yield clash.key, clash.message
