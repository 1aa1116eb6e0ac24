"""Which ext_proc phases a route needs, from its plugin names alone (no imports of plugins).

The control plane (controlplane/translate/ext_proc.py) asks Envoy only for these phases; the
filter server relies on the same answer. It lives in the policy model because both read it and
neither may import the other.
A plugin given by import path may use any hook: all phases.
"""

from __future__ import annotations

from collections.abc import Iterable

from wire.contract import (
    CANARY_HEADER,
    COLLAPSE_ID_HEADER,
    COLLAPSE_TO_HEADER,
    OVERSIZE_ROUTE_PREFIX,
    ROUTE_HEADER,
    SHADOW_CLUSTER,
    SHADOW_CLUSTER_HEADER,
    SHADOW_ID_HEADER,
    SHADOW_TO_HEADER,
    UPSTREAM_HEADER,
    VERSION_HEADER,
)

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

# the names on the wire above are written in wire/contract.py; they are re-exported here for
# the modules that read them beside the phases

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
    # the decode side's status, and its end (loads drop, a running prefill call is cancelled)
    "pd": frozenset({"request_body", "response_headers", "response_end", "stream_end"}),
    # a LoRA pool's adapter affinity: in-flight counts drop at the response's end
    "lora": frozenset({"request_body", "response_end", "stream_end"}),
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
