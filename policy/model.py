"""The policy model: frozen, typed dataclasses. Field names are the YAML keys (docs/policy.md).

A policy describes the whole mesh: LLM pools (SGLang replicas), ordinary HTTP services, the
Envoy nodes (gateways and sidecars) that route to them, the tenants and tiers whose quotas the
rate-limit service enforces, and where the rate-limit and filter (ext_proc) servers listen.
Cross-references (route → pool, fallback → pool, sidecar → service …) are checked in
:mod:`policy.semantic`, not here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import yaml

from policy.admission import AdmissionPolicy, LaneAdmission
from policy.autoscale import AutoscalePolicy
from policy.backend import BackendKind, check_backend_capacity
from policy.batch import BatchPolicy
from policy.canary import CanaryPolicy, CanaryRollback
from policy.common import (
    LANES,
    Address,
    Count,
    Lane,
    Percent,
    Port,
    Positive,
    check_name,
)
from policy.decode import Decoder, Duration, Range, Size
from policy.degradation import DegradationPolicy, LadderStep
from policy.disaggregation import Disaggregation
from policy.lora import LoraAdapters
from policy.reservation import ReservationPolicy
from policy.routing import RoutingPolicy
from policy.safety import CollapsingPolicy, IdempotencyPolicy, RouteShadow
from policy.saturation import PoolCapacity, PoolStateScrape, SaturationPolicy
from policy.scheduling import PriorityScheduling
from policy.servers import ControlPlane, FiltersServer, RateLimitServer, Replicas
from policy.tenancy import MoneyLimits, Price, QuotaLimits, Quotas, Tenant, Tier
from policy.tls import GatewayTls, UpstreamTls
from policy.tracing import Tracing
from wire.jsontypes import JsonValue

__all__ = [
    "LANES",
    "AccessLog",
    "Address",
    "AdmissionPolicy",
    "Affinity",
    "CanaryPolicy",
    "CanaryRollback",
    "CircuitBreakers",
    "CollapsingPolicy",
    "ControlPlane",
    "DegradationPolicy",
    "Downstream",
    "EmulatedPool",
    "FiltersServer",
    "Gateway",
    "HealthCheck",
    "HttpService",
    "IdempotencyPolicy",
    "LadderStep",
    "Lane",
    "LaneAdmission",
    "LlmPool",
    "MoneyLimits",
    "OutlierDetection",
    "PluginRef",
    "Policy",
    "PoolCapacity",
    "PoolStateScrape",
    "Price",
    "PriorityScheduling",
    "QuotaLimits",
    "Quotas",
    "RateLimitServer",
    "Replicas",
    "ReservationPolicy",
    "Retries",
    "Route",
    "RouteFilters",
    "RouteMatch",
    "RouteRateLimit",
    "RouteShadow",
    "RoutingPolicy",
    "SaturationPolicy",
    "Sidecar",
    "SidecarInbound",
    "SidecarOutbound",
    "Tenant",
    "Thresholds",
    "Tier",
    "Timeouts",
    "Tracing",
]


# -- LLM pools --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Affinity:
    """Ring-hash affinity: the first header present decides the replica."""

    headers: tuple[str, ...] = ("x-session-id", "x-prefix-hash")
    hash_balance_factor: Annotated[int, Range(100, 100_000)] | None = 150
    minimum_ring_size: Annotated[int, Range(1, 8_388_608)] = 1024
    maximum_ring_size: Annotated[int, Range(1, 8_388_608)] = 8_388_608
    prefix_tokens: Annotated[int, Range(16, 1_000_000)] = 256

    def __post_init__(self) -> None:
        if not self.headers:
            raise ValueError("headers: give at least one header to hash on")
        if self.minimum_ring_size > self.maximum_ring_size:
            raise ValueError("minimum_ring_size must not exceed maximum_ring_size")


@dataclass(frozen=True)
class OutlierDetection:
    enabled: bool = True
    consecutive_5xx: Positive = 5
    consecutive_gateway_errors: Positive = 5
    interval: Annotated[float, Duration(0.001)] = 10.0
    base_ejection_time: Annotated[float, Duration(0.001)] = 30.0
    max_ejection_percent: Percent = 50.0


@dataclass(frozen=True)
class HealthCheck:
    enabled: bool = True
    path: str = "/health"
    interval: Annotated[float, Duration(0.01)] = 5.0
    timeout: Annotated[float, Duration(0.01)] = 2.0
    unhealthy_threshold: Positive = 3
    healthy_threshold: Positive = 1


@dataclass(frozen=True)
class Thresholds:
    """Envoy circuit-breaker thresholds for one priority."""

    max_connections: Count = 1024
    max_pending_requests: Count = 1024
    max_requests: Count = 1024
    max_retries: Count = 3


@dataclass(frozen=True)
class CircuitBreakers:
    """Separate thresholds per lane: interactive → Envoy HIGH priority, batch → DEFAULT."""

    interactive: Thresholds = field(default_factory=Thresholds)
    batch: Thresholds = field(default_factory=Thresholds)


@dataclass(frozen=True)
class Timeouts:
    """``request: 0s`` means no total timeout (what SSE streams need); ``stream_idle`` guards them."""

    connect: Annotated[float, Duration(0.001, 3600)] = 1.0
    request: Annotated[float, Duration(0, 86400)] = 0.0
    stream_idle: Annotated[float, Duration(0, 86400)] = 60.0
    per_try: Annotated[float, Duration(0, 86400)] = 0.0


@dataclass(frozen=True)
class Retries:
    enabled: bool = True
    num_retries: Annotated[int, Range(0, 10)] = 2
    retry_on: tuple[str, ...] = (
        "connect-failure",
        "refused-stream",
        "reset",
        "retriable-status-codes",
    )
    retriable_status_codes: tuple[Annotated[int, Range(100, 599)], ...] = (503,)
    backoff_base: Annotated[float, Duration(0.001, 60)] = 0.025
    backoff_max: Annotated[float, Duration(0.001, 300)] = 0.25
    budget_percent: Percent | None = 20.0
    budget_min_concurrency: Count = 3

    def __post_init__(self) -> None:
        allowed = {
            "5xx",
            "gateway-error",
            "reset",
            "reset-before-request",
            "connect-failure",
            "envoy-ratelimited",
            "retriable-4xx",
            "refused-stream",
            "retriable-status-codes",
            "http3-post-connect-failure",
        }
        bad = [r for r in self.retry_on if r not in allowed]
        if bad:
            raise ValueError(f"retry_on: unknown condition(s) {bad}; allowed: {sorted(allowed)}")
        if self.backoff_base > self.backoff_max:
            raise ValueError("retries: backoff_base must not exceed backoff_max")


@dataclass(frozen=True)
class EmulatedPool:
    """Replicas that ``tokenweir up`` runs as SGLang emulators (backends/emulator)."""

    replicas: Annotated[int, Range(1, 64)] = 2
    profile: str = "llama-3.1-8b-h100"
    base_port: Port | None = None
    time_scale: Annotated[float, Range(0.001, 1000)] = 1.0
    cache_tokens: Positive | None = None


@dataclass(frozen=True)
class LlmPool:
    """A pool of SGLang replicas serving the same model(s)."""

    models: tuple[str, ...]
    endpoints: tuple[Address, ...] = ()
    endpoints_file: str | None = None
    emulated: EmulatedPool | None = None
    backend: BackendKind = "sglang"  # which server the replicas run (policy/backend.py)
    affinity: Affinity = field(default_factory=Affinity)
    routing: RoutingPolicy = field(default_factory=RoutingPolicy)
    outlier_detection: OutlierDetection = field(default_factory=OutlierDetection)
    health_check: HealthCheck = field(default_factory=HealthCheck)
    circuit_breakers: CircuitBreakers = field(default_factory=CircuitBreakers)
    timeouts: Timeouts = field(default_factory=Timeouts)
    retries: Retries = field(default_factory=Retries)
    fallback: str | None = None
    max_body_bytes: Annotated[int, Size(1024, 64 * 1024**2)] = 1024**2
    capacity: PoolCapacity = field(default_factory=PoolCapacity)
    saturation: SaturationPolicy = field(default_factory=SaturationPolicy)
    priority_scheduling: PriorityScheduling = field(default_factory=PriorityScheduling)
    degradation: DegradationPolicy | None = None
    canary: CanaryPolicy | None = None
    disaggregation: Disaggregation | None = None  # PD pools (disaggregation.py)
    autoscale: AutoscalePolicy | None = None  # the online planner (policy/autoscale.py)
    tls: UpstreamTls | None = None  # Envoy -> replicas over TLS (policy.tls)
    lora: LoraAdapters | None = None  # LoRA adapters served as models (lora.py)

    def __post_init__(self) -> None:
        check_backend_capacity(self.backend, self.capacity.max_running_requests)
        pd = self.disaggregation  # the loader copies its decode replicas into endpoints
        if pd is not None and (self.endpoints_file or self.endpoints not in ((), pd.decode)):
            raise ValueError(
                "disaggregation: a PD pool's endpoints are its decode replicas; "
                "leave endpoints and endpoints_file out"
            )
        if pd is not None and self.retries.enabled and self.retries.num_retries:
            raise ValueError(
                "retries: Envoy cannot retry one side of a PD request (its prefill side handed "
                "the KV to the first decode attempt); set retries.enabled: false"
            )
        if self.routing.mode == "prefix_index" and self.priority_scheduling.balance == "lane":
            raise ValueError(
                "priority_scheduling.balance: lane applies to ring_hash pools; with routing.mode "
                "prefix_index the endpoint picker chooses the replica"
            )

    @property
    def balances_lanes(self) -> bool:
        """The filter server names each request's replica by lane (ranked ring_hash pools)."""
        ps = self.priority_scheduling
        return ps.enabled and self.routing.mode == "ring_hash" and ps.balance != "ring"


# -- ordinary HTTP services -------------------------------------------------------------------
@dataclass(frozen=True)
class HttpService:
    """An existing HTTP service routed through Envoy unchanged."""

    endpoints: tuple[Address, ...] = ()
    endpoints_file: str | None = None
    hosts: tuple[str, ...] = ()
    timeouts: Timeouts = field(default_factory=lambda: Timeouts(request=15.0, stream_idle=300.0))
    retries: Retries = field(
        default_factory=lambda: Retries(retry_on=("connect-failure", "refused-stream", "reset"))
    )
    circuit_breakers: Thresholds = field(default_factory=Thresholds)
    outlier_detection: OutlierDetection | None = None
    health_check: HealthCheck | None = None
    rate_limit: QuotaLimits | None = None
    tls: UpstreamTls | None = None  # Envoy -> endpoints over TLS (policy.tls)


# -- routes and filters -----------------------------------------------------------------------
@dataclass(frozen=True)
class RouteMatch:
    prefix: str | None = None
    path: str | None = None
    hosts: tuple[str, ...] = ("*",)
    headers: dict[str, str] = field(default_factory=dict)
    model: str | None = None

    def __post_init__(self) -> None:
        if self.prefix is not None and self.path is not None:
            raise ValueError("match: give prefix or path, not both")
        if self.prefix is None and self.path is None:
            object.__setattr__(self, "prefix", "/")


@dataclass(frozen=True)
class PluginRef:
    """A plugin by built-in name (``identity``) or dotted import path (``mypkg.mod:Plugin``)."""

    name: str
    settings: dict[str, JsonValue] = field(default_factory=dict)

    @classmethod
    def __shorthand__(cls, d: Decoder, node: yaml.Node, path: str) -> yaml.Node:
        if isinstance(node, yaml.ScalarNode):  # "identity" == {name: identity}
            key = yaml.ScalarNode("tag:yaml.org,2002:str", "name", node.start_mark, node.end_mark)
            return yaml.MappingNode(
                "tag:yaml.org,2002:map", [(key, node)], node.start_mark, node.end_mark
            )
        return node


@dataclass(frozen=True)
class RouteFilters:
    """ext_proc plugin chain for this route (filters/)."""

    enabled: bool = True
    plugins: tuple[PluginRef, ...] = ()
    failure_mode: Literal["open", "closed"] = "closed"
    # where the usage plugin reads responses: Envoy's Lua meter, or the Python plugin (every
    # chunk an ext_proc message; docs/policy.md "usage_meter")
    usage_meter: Literal["envoy", "python"] = "envoy"


@dataclass(frozen=True)
class RouteRateLimit:
    """Token-aware limits for this route (ratelimit_service/)."""

    enabled: bool = True
    settle_on_stream_done: bool = True


@dataclass(frozen=True)
class Route:
    name: str
    match: RouteMatch = field(default_factory=RouteMatch)
    pool: str | None = None
    service: str | None = None
    lane: Lane | None = None
    rate_limit: RouteRateLimit | None = None
    filters: RouteFilters | None = None
    timeouts: Timeouts | None = None
    shadow: RouteShadow | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "route name")
        if (self.pool is None) == (self.service is None):
            raise ValueError(f"route {self.name!r}: give exactly one of pool or service")


# -- nodes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Downstream:
    """Bounds on client connections, per listener: slow and idle clients cannot hold them."""

    # the whole request head must arrive within this (a client trickling headers is cut off)
    request_headers_timeout: Annotated[float, Duration(0.1, 3600)] = 10.0
    # a connection with no request in flight is closed after this
    idle_timeout: Annotated[float, Duration(1, 86400)] = 300.0
    # open connections this listener keeps; more are closed at once
    max_connections: Annotated[int, Range(1, 1_000_000)] = 10_000


@dataclass(frozen=True)
class AccessLog:
    """JSON access log lines of a gateway (docs/operations.md "Access logs")."""

    enabled: bool = True
    path: str = "/dev/stdout"


@dataclass(frozen=True)
class Gateway:
    """An edge Envoy; every instance with node cluster == this name gets these resources."""

    listen: Address = field(default_factory=lambda: Address("127.0.0.1", 10000))
    routes: tuple[Route, ...] = ()
    max_request_headers_kb: Annotated[int, Range(1, 8192)] = 60
    downstream: Downstream = field(default_factory=Downstream)
    access_log: AccessLog = field(default_factory=AccessLog)
    tls: GatewayTls | None = None  # HTTPS on `listen` (policy.tls)


@dataclass(frozen=True)
class SidecarInbound:
    listen: Address
    local: Address


@dataclass(frozen=True)
class SidecarOutbound:
    listen: Address
    upstreams: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sidecar:
    """A per-service Envoy: inbound to the local app, outbound to the upstreams it may call."""

    service: str
    inbound: SidecarInbound | None = None
    outbound: SidecarOutbound | None = None
    downstream: Downstream = field(default_factory=Downstream)  # for each of its listeners


@dataclass(frozen=True)
class Policy:
    """The whole mesh."""

    version: Literal[1] = 1
    control_plane: ControlPlane = field(default_factory=ControlPlane)
    pools: dict[str, LlmPool] = field(default_factory=dict)
    services: dict[str, HttpService] = field(default_factory=dict)
    gateways: dict[str, Gateway] = field(default_factory=dict)
    sidecars: dict[str, Sidecar] = field(default_factory=dict)
    tiers: dict[str, Tier] = field(default_factory=dict)
    tenants: dict[str, Tenant] = field(default_factory=dict)
    prices: dict[str, Price] = field(default_factory=dict)  # per model, USD per 1k tokens
    ratelimit: RateLimitServer | None = None
    filters: FiltersServer | None = None
    replicas: Replicas = field(default_factory=Replicas)  # servers side by side (docs/deploy.md)
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    idempotency: IdempotencyPolicy = field(default_factory=IdempotencyPolicy)
    collapsing: CollapsingPolicy = field(default_factory=CollapsingPolicy)
    reservation: ReservationPolicy = field(default_factory=ReservationPolicy)
    batch: BatchPolicy | None = None  # the batch API and its runners (docs/batch.md)
    tracing: Tracing | None = None
    planner: dict[str, JsonValue] = field(
        default_factory=dict
    )  # `tokenweir plan` inputs (docs/capacity.md)
