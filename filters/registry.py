"""Plugins by name: built-ins, or a dotted import path (``pkg.module:factory``) for your own.

A factory is called as ``factory(settings, services)`` and returns a plugin (a class whose
``__init__`` takes those two arguments is a factory). :func:`build_routes` turns a policy into
one :class:`~filters.chain.Chain` per route that has filters.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from filters.api import Plugin, RouteInfo
from filters.chain import Chain
from filters.errors import ConfigError
from filters.plugins.admission.plugin import AdmissionPlugin
from filters.plugins.canary.plugin import CanaryPlugin
from filters.plugins.collapse.plugin import CollapsePlugin
from filters.plugins.degrade.plugin import DegradePlugin
from filters.plugins.idempotency.plugin import IdempotencyPlugin
from filters.plugins.identity.plugin import IdentityPlugin
from filters.plugins.lane.plugin import LanePlugin
from filters.plugins.lora.plugin import LoraPlugin
from filters.plugins.pd.plugin import PdPlugin
from filters.plugins.picker.plugin import PickerPlugin
from filters.plugins.prefix.plugin import PrefixPlugin
from filters.plugins.shadow.plugin import ShadowPlugin
from filters.plugins.tokens.plugin import TokensPlugin
from filters.plugins.usage.plugin import UsagePlugin
from filters.services import Services
from policy.model import Policy, Route
from policy.phases import meters_usage, stops_at_budget

__all__ = ["BUILTINS", "RouteEntry", "build_routes", "iter_routes", "load_factory", "route_info"]

Factory = Callable[[Mapping[str, object], Services], Plugin]
BUILTINS: Mapping[str, Factory] = {
    "identity": IdentityPlugin,
    "tokens": TokensPlugin,
    "prefix": PrefixPlugin,
    "lane": LanePlugin,
    "usage": UsagePlugin,
    "admission": AdmissionPlugin,
    "degrade": DegradePlugin,
    "picker": PickerPlugin,
    "pd": PdPlugin,
    "lora": LoraPlugin,
    "idempotency": IdempotencyPlugin,
    "collapse": CollapsePlugin,
    "canary": CanaryPlugin,
    "shadow": ShadowPlugin,
}


@dataclass(frozen=True)
class RouteEntry:
    info: RouteInfo
    chain: Chain


def load_factory(name: str) -> Factory:
    """A built-in by name, else ``module:attr`` or ``module.attr`` imported."""
    if name in BUILTINS:
        return BUILTINS[name]
    module, sep, attr = name.partition(":")
    if not sep:
        module, _, attr = name.rpartition(".")
    if not module or not attr:
        raise ConfigError(
            f"unknown plugin {name!r}: use a built-in ({sorted(BUILTINS)}) or 'package.module:Name'"
        )
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import plugin {name!r}: {exc}") from exc
    if not callable(obj):
        raise ConfigError(f"plugin {name!r} is not callable")
    factory: Factory = obj
    return factory


def route_info(policy: Policy, route: Route) -> RouteInfo:
    pool = policy.pools.get(route.pool) if route.pool else None
    server = policy.filters
    limit = server.max_body_bytes if server is not None else 1024**2
    if pool is not None:
        limit = min(limit, pool.max_body_bytes)
    return RouteInfo(
        name=route.name,
        pool=route.pool,
        models=tuple(pool.models) if pool is not None else (),
        lane=route.lane,
        prefix_tokens=pool.affinity.prefix_tokens if pool is not None else 256,
        max_body_bytes=limit,
        failure_mode=route.filters.failure_mode if route.filters is not None else "closed",
        rate_limited=route.rate_limit is not None and route.rate_limit.enabled,
        metered_in_envoy=meters_usage(route),
        stops_at_budget=stops_at_budget(route),
    )


def build_routes(policy: Policy, services: Services) -> dict[str, RouteEntry]:
    """One entry per route name with filters enabled (first gateway wins on a shared name)."""
    return dict(iter_routes(policy, services))


def iter_routes(policy: Policy, services: Services) -> Iterator[tuple[str, RouteEntry]]:
    """:func:`build_routes` one route at a time (a reload builds them between requests)."""
    server = policy.filters
    deadline = (server.message_timeout if server is not None else 0.2) * 0.75
    seen: set[str] = set()
    for gateway in policy.gateways.values():
        for route in gateway.routes:
            if route.filters is None or not route.filters.enabled or route.name in seen:
                continue
            seen.add(route.name)
            plugins: list[Plugin] = []
            for ref in route.filters.plugins:
                try:
                    plugins.append(load_factory(ref.name)(dict(ref.settings), services))
                except Exception as exc:  # a user's factory may raise anything: report it once
                    raise ConfigError(f"route {route.name!r}: plugin {ref.name!r}: {exc}") from exc
            info = route_info(policy, route)
            chain = Chain(
                route.name,
                plugins,
                failure_mode=info.failure_mode,
                deadline=deadline,
                events=services.metrics,
            )
            yield route.name, RouteEntry(info, chain)
