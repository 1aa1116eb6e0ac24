"""Which ext_proc phases a route needs, from its plugin names alone (no imports of plugins).

The control plane (controlplane/translate/ext_proc.py) asks Envoy only for these phases; the
filter server relies on the same answer. It lives in the policy model because both read it and
neither may import the other.
A plugin given by import path may use any hook: all phases.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BUILTIN_HOOKS",
    "CANARY_HEADER",
    "COLLAPSE_ID_HEADER",
    "COLLAPSE_TO_HEADER",
    "OVERSIZE_ROUTE_PREFIX",
    "ROUTE_HEADER",
    "SHADOW_CLUSTER",
    "SHADOW_CLUSTER_HEADER",
    "SHADOW_ID_HEADER",
    "SHADOW_TO_HEADER",
    "UPSTREAM_HEADER",
    "VERSION_HEADER",
    "meters_usage",
    "route_hooks",
    "stops_at_budget",
    "uses_collapse",
    "uses_shadow_pairs",
]

ROUTE_HEADER = "x-tokenweir-route"  # gRPC initial metadata naming the route (set per route)
# added by Envoy to the responses of a route whose usage plugin stops streams at the budget: the
# replica that answered (%UPSTREAM_HOST%), where the plugin sends the backend abort; the plugin
# removes it before the client sees it
UPSTREAM_HEADER = "x-tokenweir-upstream"
# the route name of a body over its route's limit, followed by the limit in bytes: the filter
# server reads such a body to its end (discarding it) and answers 413, so the client can read it
OVERSIZE_ROUTE_PREFIX = "tokenweir.oversize:"
# set by the collapse plugin on a follower (clients' x-tokenweir-* headers are stripped first):
# the route with this header sends the request to the filter server's fan-out endpoint
# (host:port, an ORIGINAL_DST cluster), which streams the leader's answer; the id names the run
COLLAPSE_TO_HEADER = "x-tokenweir-collapse-to"
COLLAPSE_ID_HEADER = "x-tokenweir-collapse-id"
# set by the shadow plugin on a request it samples for mirroring (clients' are stripped first):
# the route's mirror policy reads the cluster name from the first (Envoy mirrors nothing when it
# is absent), that cluster (ORIGINAL_DST) sends the mirror to the host:port in the second (the
# sampling filter process's shadow recorder), and the id pairs the mirror with its primary
SHADOW_CLUSTER_HEADER = "x-tokenweir-shadow-cluster"
SHADOW_CLUSTER = "tokenweir_shadow"  # the value: the recorders' ORIGINAL_DST cluster
SHADOW_TO_HEADER = "x-tokenweir-shadow-to"
SHADOW_ID_HEADER = "x-tokenweir-shadow-id"
# set by the canary plugin for tenants allowed to force a version: "canary" or "baseline"
CANARY_HEADER = "x-tokenweir-canary"
# added by Envoy to every response of a pool with a canary: which version answered
VERSION_HEADER = "x-tokenweir-version"

# ``response_end`` (not a plugin hook): the plugin's ``stream_end`` must come at the response's
# end, but it reads no chunk. Envoy ends the ext_proc stream right after the last phase it
# sends; with the response body NONE and the response trailers SEND, it keeps the stream open
# to the response's end (and sends trailers only if the backend has some): ``stream_end`` then
# comes when the response is done, with no message per chunk. Measured on Envoy 1.40:
# tests/integration/test_response_end.py.
BUILTIN_HOOKS: dict[str, frozenset[str]] = {
    "identity": frozenset({"request_headers"}),
    "lane": frozenset({"request_headers"}),
    "tokens": frozenset({"request_headers", "request_body"}),
    "prefix": frozenset({"request_body"}),
    "usage": frozenset({"response_chunk", "stream_end"}),
    # the admission slot is freed at the response's end
    "admission": frozenset({"request_headers", "response_end", "stream_end"}),
    "degrade": frozenset({"request_headers", "response_headers"}),
    # in-flight load drops at the response's end
    "picker": frozenset({"request_body", "response_end", "stream_end"}),
    "idempotency": frozenset(
        {"request_headers", "request_body", "response_headers", "response_chunk", "stream_end"}
    ),
    "canary": frozenset({"request_headers", "response_headers"}),
    "shadow": frozenset(
        {"request_headers", "request_body", "response_headers", "response_chunk", "stream_end"}
    ),
    # response_chunk keeps the stream open to the response's end, where the caller leaves
    "collapse": frozenset({"request_headers", "request_body", "response_chunk", "stream_end"}),
}
_ALL = frozenset(
    {"request_headers", "request_body", "response_headers", "response_chunk", "stream_end"}
)


def route_hooks(plugin_names: Iterable[str]) -> frozenset[str]:
    hooks: set[str] = {"request_headers"}  # always: internal headers are stripped there
    for name in plugin_names:
        hooks |= BUILTIN_HOOKS.get(name, _ALL)
    return frozenset(hooks)


def meters_usage(route: object) -> bool:
    """Whether Envoy's Lua usage meter (controlplane/translate/usage_meter.py) meters a policy
    route: a pool route whose enabled plugins list ``usage`` and no plugin that reads the
    response body in Python (admission, picker, idempotency, collapse, custom ones read the
    usage the Python usage plugin finds: there the body stays STREAMED through ext_proc and the
    Python plugin meters; tests/integration/test_usage_twin.py drives both with the same streams).
    Admission and the picker need only the response's end (``response_end``): Envoy meters
    there."""
    f = getattr(route, "filters", None)
    if getattr(route, "pool", None) is None or f is None or not f.enabled:
        return False
    if getattr(f, "usage_meter", "envoy") != "envoy" or stops_at_budget(route):
        return False
    names = [p.name for p in f.plugins]
    others = [n for n in names if n != "usage"]
    return "usage" in names and "response_chunk" not in route_hooks(others)


def stops_at_budget(route: object) -> bool:
    """Whether a pool route's usage plugin stops streams at the tenant's budget (its setting
    ``stop_at_budget``): the Python meter reads every chunk there (the Lua meter cannot draw
    top-ups), the response headers go to the filter server (the replica to abort is named in
    :data:`UPSTREAM_HEADER`). docs/quotas.md, "The in-stream stop"."""
    f = getattr(route, "filters", None)
    if getattr(route, "pool", None) is None or f is None or not f.enabled:
        return False
    return any(p.name == "usage" and p.settings.get("stop_at_budget") is True for p in f.plugins)


def uses_collapse(route: object) -> bool:
    """Whether a policy route lists the ``collapse`` plugin (and has its filters on)."""
    f = getattr(route, "filters", None)
    return f is not None and f.enabled and any(p.name == "collapse" for p in f.plugins)


def uses_shadow_pairs(route: object) -> bool:
    """Whether a route mirrors to a shadow pool through the ``shadow`` plugin (pairs recorded);
    a route with ``shadow:`` but without the plugin is mirrored by Envoy alone."""
    f = getattr(route, "filters", None)
    return (
        getattr(route, "shadow", None) is not None
        and f is not None
        and f.enabled
        and any(p.name == "shadow" for p in f.plugins)
    )
