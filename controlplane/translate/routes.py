"""RouteConfigurations: gateway routes (pools and services), sidecar inbound and outbound.

A pool route becomes two Envoy routes when the lane is chosen per request: one that matches
``x-tokenweir-lane: interactive`` (priority HIGH → the interactive circuit-breaker thresholds)
and one for everything else (priority DEFAULT → batch thresholds). The lane header is set by
the filter server, which strips any client-supplied ``x-tokenweir-*`` header first.
"""

from __future__ import annotations

from collections.abc import Callable

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3.percent_pb2 import FractionalPercent
from google.protobuf import wrappers_pb2

from controlplane.translate import names
from controlplane.translate.edge import too_large_route
from controlplane.translate.protos import Packed, dur, u32
from policy.model import (
    Gateway,
    LlmPool,
    Policy,
    Retries,
    Route,
    RouteShadow,
    Sidecar,
    Timeouts,
)
from policy.phases import (
    CANARY_HEADER,
    COLLAPSE_TO_HEADER,
    SHADOW_CLUSTER_HEADER,
    UPSTREAM_HEADER,
    VERSION_HEADER,
    stops_at_budget,
    uses_collapse,
    uses_shadow_pairs,
)
from wire.contract import DEGRADE_HEADER, HEADER_PREFIX, LANE_HEADER, MODEL_HEADER

__all__ = [
    "INTERNAL_PREFIX",
    "PerRoute",
    "gateway_routes",
    "sidecar_inbound_routes",
    "sidecar_outbound_routes",
]

INTERNAL_PREFIX = HEADER_PREFIX

_NO_RETRIES = Retries(enabled=False)

# Per-route filter config for a route: route → {filter name: its packed per-route config}.
PerRoute = Callable[[Route], dict[str, Packed]]


def gateway_routes(
    policy: Policy, node: str, gw: Gateway, per_route: list[PerRoute]
) -> route_pb2.RouteConfiguration:
    vhosts: dict[tuple[str, ...], rc.VirtualHost] = {}
    for route in gw.routes:
        hosts = route.match.hosts
        vh = vhosts.get(hosts)
        if vh is None:
            vh = rc.VirtualHost(name=f"{node}_{len(vhosts)}", domains=list(hosts))
            vhosts[hosts] = vh
        vh.routes.extend(_policy_route(policy, route, per_route))
    return route_pb2.RouteConfiguration(
        name=names.route_config_name(node, "gateway"),
        virtual_hosts=list(vhosts.values()),
        request_headers_to_remove=[],
        validate_clusters=wrappers_pb2.BoolValue(value=False),
    )


def sidecar_inbound_routes(node: str, sc: Sidecar) -> route_pb2.RouteConfiguration:
    vh = rc.VirtualHost(
        name=f"{node}_inbound",
        domains=["*"],
        routes=[
            rc.Route(
                name=f"{node}_inbound",
                match=rc.RouteMatch(prefix="/"),
                route=rc.RouteAction(cluster=names.local_cluster(node), timeout=dur(0)),
            )
        ],
    )
    return route_pb2.RouteConfiguration(
        name=names.route_config_name(node, "inbound"), virtual_hosts=[vh]
    )


def sidecar_outbound_routes(policy: Policy, node: str, sc: Sidecar) -> route_pb2.RouteConfiguration:
    assert sc.outbound is not None
    vhosts = []
    for upstream in sc.outbound.upstreams:
        if upstream in policy.services:
            svc = policy.services[upstream]
            cluster, timeouts, retries = names.service_cluster(upstream), svc.timeouts, svc.retries
            hosts = (upstream, *svc.hosts)
        else:
            pool = policy.pools[upstream]
            cluster, timeouts, retries = names.pool_cluster(upstream), pool.timeouts, pool.retries
            hosts = (upstream,)
        domains = sorted({d for h in hosts for d in (h, f"{h}:*")})
        action = _action(cluster, timeouts, retries, rc.RouteAction())
        vhosts.append(
            rc.VirtualHost(
                name=f"{node}_out_{upstream}",
                domains=domains,
                routes=[
                    rc.Route(
                        name=f"{node}_out_{upstream}", match=rc.RouteMatch(prefix="/"), route=action
                    )
                ],
            )
        )
    return route_pb2.RouteConfiguration(
        name=names.route_config_name(node, "outbound"), virtual_hosts=vhosts
    )


# -- one policy route → Envoy routes ----------------------------------------------------------
def _policy_route(policy: Policy, route: Route, per_route: list[PerRoute]) -> list[rc.Route]:
    configs: dict[str, Packed] = {}
    for fn in per_route:
        configs.update(fn(route))
    if route.service is not None:
        svc = policy.services[route.service]
        action = _action(
            names.service_cluster(route.service),
            route.timeouts or svc.timeouts,
            svc.retries,
            rc.RouteAction(),
        )
        return [_route(route.name, route, action, configs)]
    assert route.pool is not None
    pool = policy.pools[route.pool]
    cluster = (
        names.fallback_cluster(route.pool) if pool.fallback else names.pool_cluster(route.pool)
    )
    timeouts = route.timeouts or pool.timeouts
    lanes_vary = route.lane is None and route.filters is not None and route.filters.enabled
    out: list[rc.Route] = []
    split = pool.canary is not None and pool.fallback is None
    first = len(out)
    if lanes_vary:
        hi = _pool_action(cluster, pool, timeouts, base_pb2.HIGH, split=split)
        out.append(_route(f"{route.name}/interactive", route, hi, configs, lane="interactive"))
    prio = base_pb2.HIGH if route.lane == "interactive" else base_pb2.DEFAULT
    main = _pool_action(cluster, pool, timeouts, prio, split=split)
    out.append(_route(route.name, route, main, configs))
    if route.shadow is not None:
        for r in out[first:]:  # the routes that reach the pool (not forced, collapsed, 413)
            r.route.request_mirror_policies.append(_mirror(route.shadow, uses_shadow_pairs(route)))
    if _degrades_to_fallback(route, pool) and pool.fallback is not None:
        # the degrade plugin sets the header (a client's is deleted first) and re-picks the route
        small = policy.pools[pool.fallback]
        action = _pool_action(names.pool_cluster(pool.fallback), small, timeouts, base_pb2.DEFAULT)
        degraded = _route(f"{route.name}/fallback", route, action, configs)
        degraded.match.headers.append(
            rc.HeaderMatcher(
                name=DEGRADE_HEADER, string_match=string_pb2.StringMatcher(exact="fallback")
            )
        )
        out.insert(0, degraded)
    if split:
        # a tenant allowed to force a version: the canary plugin sets the header
        for version, target in (
            ("canary", names.canary_cluster(route.pool)),
            ("baseline", names.pool_cluster(route.pool)),
        ):
            forced = _route(
                f"{route.name}/{version}",
                route,
                _pool_action(target, pool, timeouts, base_pb2.DEFAULT),
                configs,
            )
            forced.match.headers.append(
                rc.HeaderMatcher(
                    name=CANARY_HEADER, string_match=string_pb2.StringMatcher(exact=version)
                )
            )
            forced.response_headers_to_add.append(_version_header(version))
            out.insert(0, forced)
    if uses_collapse(route):
        # a follower of a collapsed request: the filter server's fan-out endpoint answers it
        follower = _route(
            f"{route.name}/collapsed",
            route,
            _action(names.COLLAPSE_CLUSTER, timeouts, _NO_RETRIES, rc.RouteAction()),
            configs,
        )
        follower.match.headers.append(rc.HeaderMatcher(name=COLLAPSE_TO_HEADER, present_match=True))
        out.insert(0, follower)
    if route.filters is not None and route.filters.enabled:
        # ext_proc buffers the body: without this Envoy's connection buffer (1 MiB) caps it
        # and answers a larger body allowed by the policy with a plain-text 413
        server_limit = policy.filters.max_body_bytes if policy.filters is not None else 1024**2
        limit = min(server_limit, pool.max_body_bytes)
        for r in out:
            r.request_body_buffer_limit.value = limit
        out.insert(0, too_large_route(route.name, out[-1].match, limit, list(configs)))
    return out


def _degrades_to_fallback(route: Route, pool: LlmPool) -> bool:
    f = route.filters
    return (
        pool.degradation is not None
        and any(s.action == "fallback" for s in pool.degradation.steps)
        and f is not None
        and f.enabled
        and any(p.name == "degrade" for p in f.plugins)
    )


def _route(
    name: str,
    route: Route,
    action: rc.RouteAction,
    configs: dict[str, Packed],
    lane: str | None = None,
) -> rc.Route:
    m = route.match
    match = rc.RouteMatch(prefix=m.prefix) if m.path is None else rc.RouteMatch(path=m.path)
    headers = dict(m.headers)
    if lane is not None:
        headers[LANE_HEADER] = lane
    if m.model is not None:
        headers[MODEL_HEADER] = m.model
    for key, value in sorted(headers.items()):
        match.headers.append(
            rc.HeaderMatcher(name=key, string_match=string_pb2.StringMatcher(exact=value))
        )
    r = rc.Route(name=name, match=match, route=action)
    if stops_at_budget(route):  # the replica the usage plugin aborts at a spent budget
        r.response_headers_to_add.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=UPSTREAM_HEADER, value="%UPSTREAM_HOST%"),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        )
    for filter_name, cfg in configs.items():
        r.typed_per_filter_config[filter_name].CopyFrom(cfg)
    return r


def _pool_action(
    cluster: str, pool: LlmPool, timeouts: Timeouts, priority: int, *, split: bool = False
) -> rc.RouteAction:
    action = rc.RouteAction(priority=priority)  # type: ignore[arg-type]  # an int is a valid RoutingPriority enum value; the stub wants the enum type
    for header in pool.affinity.headers:
        action.hash_policy.append(
            rc.RouteAction.HashPolicy(
                header=rc.RouteAction.HashPolicy.Header(header_name=header), terminal=True
            )
        )
    action = _action(cluster, timeouts, pool.retries, action)
    if split and pool.canary is not None:
        action.ClearField("cluster")
        action.weighted_clusters.CopyFrom(_split(cluster, pool.canary.weight))
    return action


def _split(baseline: str, weight: int) -> rc.WeightedCluster:
    """Baseline and canary by ``weight`` percent, picked by the route's hash policy (the session
    header first): one session stays on one version while the weight holds. Every response
    says which version answered (``x-tokenweir-version``, read by the canary plugin)."""
    return rc.WeightedCluster(
        clusters=[
            rc.WeightedCluster.ClusterWeight(
                name=baseline,
                weight=wrappers_pb2.UInt32Value(value=100 - weight),
                response_headers_to_add=[_version_header("baseline")],
            ),
            rc.WeightedCluster.ClusterWeight(
                name=f"{baseline}_canary",
                weight=wrappers_pb2.UInt32Value(value=weight),
                response_headers_to_add=[_version_header("canary")],
            ),
        ],
        use_hash_policy=wrappers_pb2.BoolValue(value=True),
    )


def _mirror(shadow: RouteShadow, paired: bool) -> rc.RouteAction.RequestMirrorPolicy:
    """Envoy sends the sampled share to the shadow pool and discards its answer; the primary
    never waits for it. The mirrored request passed every filter with the primary (one
    reservation, the primary's), so it costs the tenant nothing. ``paired`` (the shadow
    plugin): the filter server samples, and names the mirror's cluster (its recorder's) in a
    header; a request without the header is not mirrored."""
    if paired:
        return rc.RouteAction.RequestMirrorPolicy(cluster_header=SHADOW_CLUSTER_HEADER)
    share = FractionalPercent(
        numerator=round(shadow.fraction * 1_000_000), denominator=FractionalPercent.MILLION
    )
    return rc.RouteAction.RequestMirrorPolicy(
        cluster=names.pool_cluster(shadow.pool),
        runtime_fraction=base_pb2.RuntimeFractionalPercent(default_value=share),
    )


def _version_header(version: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=VERSION_HEADER, value=version),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _action(
    cluster: str, timeouts: Timeouts, retries: Retries, action: rc.RouteAction
) -> rc.RouteAction:
    action.cluster = cluster
    action.timeout.CopyFrom(dur(timeouts.request))  # 0s: no total timeout (streams)
    if timeouts.stream_idle > 0:
        action.idle_timeout.CopyFrom(dur(timeouts.stream_idle))
    if retries.enabled and retries.num_retries > 0:
        rp = rc.RetryPolicy(
            retry_on=",".join(retries.retry_on),
            num_retries=u32(retries.num_retries),
            retriable_status_codes=list(retries.retriable_status_codes),
            retry_back_off=rc.RetryPolicy.RetryBackOff(
                base_interval=dur(retries.backoff_base), max_interval=dur(retries.backoff_max)
            ),
            retry_host_predicate=[
                rc.RetryPolicy.RetryHostPredicate(
                    name="envoy.retry_host_predicates.previous_hosts",
                    typed_config=_previous_hosts(),
                )
            ],
            # Ring hash re-picks by walking to the next ring entries, which often belong to
            # the same host: give it enough attempts to really find another replica.
            host_selection_retry_max_attempts=10,
        )
        if timeouts.per_try > 0:
            rp.per_try_timeout.CopyFrom(dur(timeouts.per_try))
        action.retry_policy.CopyFrom(rp)
    return action


def _previous_hosts():  # type: ignore[no-untyped-def]  # returns a message of a generated module that has no stubs
    from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2

    from controlplane.translate.protos import any_of

    return any_of(previous_hosts_pb2.PreviousHostsPredicate())
