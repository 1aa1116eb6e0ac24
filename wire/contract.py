"""The names Envoy, the filter server and the rate-limit service share, each written once.

Envoy's configuration is rendered from these (controlplane/translate/), the filter server sets
and reads them (filters/), the rate-limit service parses them (ratelimit_service/). A name
changed here changes on every side at once; ``tests/test_wire_contract.py`` checks that no
product module writes one of them as a literal again. The Lua usage meter
(controlplane/translate/usage.lua) runs inside Envoy and cannot import Python: it spells
``tokenweir`` / ``settle_tokens`` / ``settle_usd_micros`` itself, and the same test holds its
literals to these.

Ground layer: this module imports nothing (docs/architecture.md, "The layers").
"""

from __future__ import annotations

__all__ = [
    "CANARY_HEADER",
    "COLLAPSE_ID_HEADER",
    "COLLAPSE_TO_HEADER",
    "DEGRADED_HEADER",
    "DEGRADE_HEADER",
    "DESCRIPTOR_HEADERS",
    "ENDPOINT_HEADER",
    "HEADER_PREFIX",
    "IDEMPOTENCY_IN_USE",
    "IDEMPOTENCY_UNSTORED",
    "KEY_LANE",
    "KEY_MODEL",
    "KEY_PHASE",
    "KEY_REMOTE_ADDRESS",
    "KEY_REQUEST_ID",
    "KEY_ROUTE",
    "KEY_SERVICE",
    "KEY_TENANT",
    "KEY_USD",
    "LANE_HEADER",
    "METADATA_NAMESPACE",
    "MODEL_HEADER",
    "OVERSIZE_ROUTE_PREFIX",
    "PHASE_REQUESTS",
    "PHASE_RESERVE",
    "PHASE_SETTLE",
    "RATELIMIT_DOMAIN",
    "REQUEST_ID_HEADER",
    "RESERVE_HEADER",
    "ROUTE_HEADER",
    "SERVED_MODEL_HEADER",
    "SETTLE_KEY",
    "SETTLE_USD_KEY",
    "SHADOW_CLUSTER",
    "SHADOW_CLUSTER_HEADER",
    "SHADOW_HEADER_PREFIX",
    "SHADOW_ID_HEADER",
    "SHADOW_OVER_LIMIT_HEADER",
    "SHADOW_TO_HEADER",
    "TENANT_HEADER",
    "TIER_HEADER",
    "UPSTREAM_HEADER",
    "VERSION_HEADER",
]

# -- headers (lower case, as HTTP/2 carries them) ---------------------------------------------
HEADER_PREFIX = "x-tokenweir-"  # every header of ours; the identity step strips clients' copies
TENANT_HEADER = "x-tokenweir-tenant"  # set by the identity plugin; a descriptor entry
TIER_HEADER = "x-tokenweir-tier"  # set by the identity plugin when the tenant has a tier
MODEL_HEADER = "x-tokenweir-model"  # the model asked for; routes match it; a descriptor entry
LANE_HEADER = "x-tokenweir-lane"  # set by the lane plugin; routes match it; a descriptor entry
RESERVE_HEADER = "x-tokenweir-reserve"  # tokens to reserve: the reserve descriptor's hits
REQUEST_ID_HEADER = "x-request-id"  # Envoy's own; a descriptor entry
ENDPOINT_HEADER = "x-tokenweir-endpoint"  # the picker's replica (internal: stripped from clients)
DEGRADE_HEADER = "x-tokenweir-degrade"  # request: set by the degrade plugin, matched by the route
DEGRADED_HEADER = "x-tokenweir-degraded"  # response: the degradation actions taken
SERVED_MODEL_HEADER = "x-tokenweir-served-model"  # response: the model that served, if swapped
ROUTE_HEADER = "x-tokenweir-route"  # gRPC initial metadata naming the route (set per route)
# added by Envoy to the responses of a route whose usage plugin stops streams at the budget: the
# replica that answered (%UPSTREAM_HOST%), where the plugin sends the backend abort; the plugin
# removes it before the client sees it
UPSTREAM_HEADER = "x-tokenweir-upstream"
# set by the collapse plugin on a follower: the route with this header sends the request to the
# filter server's fan-out endpoint (host:port, an ORIGINAL_DST cluster); the id names the run
COLLAPSE_TO_HEADER = "x-tokenweir-collapse-to"
COLLAPSE_ID_HEADER = "x-tokenweir-collapse-id"
# set by the shadow plugin on a request it samples for mirroring: the route's mirror policy reads
# the cluster name from the first, that cluster (ORIGINAL_DST) sends the mirror to the host:port
# in the second (the shadow recorder), and the id pairs the mirror with its primary
SHADOW_HEADER_PREFIX = "x-tokenweir-shadow-"
SHADOW_CLUSTER_HEADER = "x-tokenweir-shadow-cluster"
SHADOW_CLUSTER = "tokenweir_shadow"  # its value: the recorders' ORIGINAL_DST cluster
SHADOW_TO_HEADER = "x-tokenweir-shadow-to"
SHADOW_ID_HEADER = "x-tokenweir-shadow-id"
SHADOW_OVER_LIMIT_HEADER = "x-tokenweir-shadow-over-limit"  # rate-limit response, shadow mode
CANARY_HEADER = "x-tokenweir-canary"  # set by the canary plugin: "canary" or "baseline"
VERSION_HEADER = "x-tokenweir-version"  # added by Envoy to a canaried pool's responses
# the route name of a body over its route's limit, followed by the limit in bytes
OVERSIZE_ROUTE_PREFIX = "tokenweir.oversize:"

# -- dynamic metadata -------------------------------------------------------------------------
METADATA_NAMESPACE = "tokenweir"  # the filter server's and the usage meter's namespace
SETTLE_KEY = "settle_tokens"  # tokens to settle: the settle descriptor's hits
SETTLE_USD_KEY = "settle_usd_micros"  # the real price, micro-USD; "-" when unknown

# -- error codes a client of the gateway acts on (the batch runner: batch_service/runner.py) -----
# 409 of the idempotency plugin: a request with this key still runs (try again later for its
# answer), or it finished and its answer was too large to keep (final: it is not run again)
IDEMPOTENCY_IN_USE = "idempotency_key_in_use"
IDEMPOTENCY_UNSTORED = "idempotency_answer_not_stored"

# -- rate-limit descriptors -------------------------------------------------------------------
RATELIMIT_DOMAIN = "tokenweir"  # the default domain of the rate-limit service
KEY_PHASE = "phase"
PHASE_RESERVE, PHASE_SETTLE, PHASE_REQUESTS = "reserve", "settle", "requests"
KEY_TENANT, KEY_MODEL, KEY_LANE, KEY_REQUEST_ID = "tenant", "model", "lane", "request_id"
KEY_USD = "usd"  # settle: the real price in micro-USD
# the route, on the descriptors of the routes that pay a price factor (batch lines): the
# rate-limit service prices their reservation with it (quota.cost.price_factor)
KEY_ROUTE = "route"
KEY_SERVICE, KEY_REMOTE_ADDRESS = "service", "remote_address"  # request-count descriptors
# request header → descriptor key, in the order Envoy's actions list them
DESCRIPTOR_HEADERS: tuple[tuple[str, str], ...] = (
    (TENANT_HEADER, KEY_TENANT),
    (MODEL_HEADER, KEY_MODEL),
    (LANE_HEADER, KEY_LANE),
    (REQUEST_ID_HEADER, KEY_REQUEST_ID),
)
