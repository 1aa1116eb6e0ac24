"""The plugin API: what a plugin implements, what it receives, what it returns.

A plugin is an object with five async hooks (see :class:`Plugin`). Subclass :class:`BasePlugin`
and override only the hooks you need: the chain calls a hook only on plugins that override it,
and the control plane asks Envoy only for the phases some plugin of the route needs.

Each hook gets the per-request :class:`Context` (it travels from the request to the end of the
response): the parsed body (:class:`~filters.bodies.LlmRequest`), the :class:`Plan` (served pool
and model, token cap, priority, reservation) that plugins read and write, and each plugin's own
typed state under a :class:`Slot` key (``ctx.put`` / ``ctx.get`` / ``ctx.take``). It returns ``None``
(nothing to change) or a :class:`Result`: header mutations, a body replacement, dynamic
metadata for the next Envoy filters (namespace ``tokenweir``), or an immediate :class:`Reply`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Literal, Protocol, TypeVar, cast, runtime_checkable

from filters.bodies import Decoded, LlmRequest
from wire.jsontypes import JsonValue

__all__ = [
    "HOOKS",
    "BasePlugin",
    "Context",
    "Hook",
    "Plan",
    "Plugin",
    "Reply",
    "Result",
    "RouteInfo",
    "Slot",
    "Usage",
    "openai_error",
]

Hook = Literal[
    "request_headers", "request_body", "response_headers", "response_chunk", "stream_end"
]
HOOKS: tuple[Hook, ...] = (
    "request_headers",
    "request_body",
    "response_headers",
    "response_chunk",
    "stream_end",
)


@dataclass(frozen=True, slots=True)
class Reply:
    """An immediate HTTP answer; Envoy sends it to the client and the request goes no further."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    details: str = ""


def openai_error(
    status: int,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
    headers: Mapping[str, str] | None = None,
    details: str = "",
) -> Reply:
    """A :class:`Reply` with the error body OpenAI clients understand."""
    body = {
        "error": {
            "message": message,
            "type": error_type,
            "param": param,
            "code": code if code is not None else status,
        }
    }
    return Reply(
        status=status,
        body=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
        details=details or f"tokenweir_{status}",
    )


@dataclass(frozen=True, slots=True)
class Result:
    """What a hook asks for. Later plugins see the headers and body earlier ones produced."""

    set_headers: Mapping[str, str] = field(default_factory=dict)
    remove_headers: tuple[str, ...] = ()
    body: bytes | None = None
    metadata: Mapping[str, JsonValue] = field(default_factory=dict)
    reply: Reply | None = None
    clear_route_cache: bool = False


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """The route a request matched, as the policy describes it."""

    name: str
    pool: str | None = None
    models: tuple[str, ...] = ()
    lane: str | None = None
    prefix_tokens: int = 256
    max_body_bytes: int = 1024**2
    failure_mode: Literal["open", "closed"] = "closed"
    rate_limited: bool = False
    # Envoy's Lua usage meter reads the response (policy.phases.meters_usage)
    metered_in_envoy: bool = False
    # the usage plugin stops a stream at the tenant's budget (stop_at_budget): a reservation
    # may then be smaller than the worst case (policy.phases.stops_at_budget)
    stops_at_budget: bool = False


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts the backend reported for one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class Plan:
    """How this request is served, as the plugins decided it: one per request, ``ctx.plan``.

    ``pool`` starts as the route's pool; the ``degrade`` plugin may send the request to a
    fallback pool and model and cap its ``max_tokens``; ``tokens`` sets ``reserve``; admission
    sets ``priority`` and ``replica`` where it places the request on a ranked pool.
    """

    pool: str | None = None  # the pool that serves it: the route's, or the ladder's fallback
    model: str | None = None  # the model sent upstream instead of the one asked for (fallback)
    max_tokens_cap: int | None = None  # a degradation step's cap on max_tokens (None: none)
    degraded: tuple[str, ...] = ()  # the degradation ladder's actions taken (x-tokenweir-degraded)
    # the ladder's shed step let it through because another filter process kept the
    # Retry-After promise made to it (admission gives it its place: returned)
    returned: bool = False
    priority: int | None = None  # the backend priority it runs at (ranked pools)
    replica: str | None = None  # the replica admission's lane balance placed it on
    reserve: int | None = None  # tokens the rate limit reserves (x-tokenweir-reserve)
    # the replica the lora plugin's adapter affinity placed a LoRA request on; the picker, after
    # it, moves the request to where the index finds the adapter's prefix cached
    adapter_replica: str | None = None


T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)  # a slot names its value's type only: no value held


@dataclass(frozen=True, slots=True, eq=False)
class Slot(Generic[T_co]):
    """A typed key for one plugin's own per-request state (``ctx.put(SLOT, value)``); compared
    by identity, so two plugins never share one by accident. ``name`` is for debugging."""

    name: str


@dataclass(slots=True)
class Context:
    """Per-request state, created at the request headers and dropped after the stream ends."""

    route: RouteInfo
    started: float
    request_id: str = ""
    method: str = ""
    path: str = ""
    request_headers: dict[str, str] = field(default_factory=dict)
    tenant: str | None = None
    tier: str | None = None
    lane: str | None = None
    model: str | None = None
    body: LlmRequest | None = None  # the parsed request body, once a plugin read it
    # the latest decode of the body's bytes (filters.bodies.body_json): one decode per request
    decoded: Decoded | None = None
    # the prompt as the pool's backend renders it (its model's chat template), where the tokens
    # plugin rendered it to count it exactly: the picker hashes the same bytes
    rendered: bytes | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    stream: bool = False
    client_wants_usage: bool = False
    status: int | None = None
    usage: Usage | None = None
    # the services' clock when the first response body chunk passed (set by the usage plugin)
    first_token_at: float | None = None
    plan: Plan = field(default_factory=Plan)
    outcome: str | None = None  # how the answer ended (tokenweir_filters_requests_total), usage
    metered_in_envoy: bool = False  # Envoy's usage meter reports this request (server)
    # your own plugin's per-request state, keyed by your plugin's name (the built-ins use slots)
    scratch: dict[str, object] = field(default_factory=dict)
    state: dict[Slot[object], object] = field(default_factory=dict)
    # set by the server: ask Envoy to wait up to this many more seconds for the current phase's
    # answer (ext_proc override_message_timeout); a plugin that queues calls it before waiting
    hold: Callable[[float], Awaitable[None]] | None = None

    def __post_init__(self) -> None:
        if self.plan.pool is None:
            self.plan.pool = self.route.pool

    @property
    def reserve(self) -> int | None:
        """``plan.reserve`` (kept under this name for plugins written before the plan)."""
        return self.plan.reserve

    @reserve.setter
    def reserve(self, value: int | None) -> None:
        self.plan.reserve = value

    def put(self, slot: Slot[T], value: T) -> None:
        """Keep ``value`` as this request's state under ``slot``."""
        self.state[slot] = value

    def get(self, slot: Slot[T]) -> T | None:
        """The state kept under ``slot`` (None: none)."""
        return cast("T | None", self.state.get(slot))

    def take(self, slot: Slot[T]) -> T | None:
        """The state kept under ``slot``, removed (None: none)."""
        return cast("T | None", self.state.pop(slot, None))


@runtime_checkable
class Plugin(Protocol):
    """The five hooks. Request hooks may do I/O (bounded by the route's deadline); response hooks
    run once per streamed chunk and must stay cheap and must not wait on I/O."""

    @property
    def name(self) -> str: ...

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None: ...

    async def request_body(self, ctx: Context, body: bytes) -> Result | None: ...

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None: ...

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None: ...

    async def stream_end(self, ctx: Context) -> None: ...


class BasePlugin:
    """No-op hooks; override the ones you need.

    ``bounded``: set it only when every hook is guaranteed to finish quickly (its I/O has its
    own timeouts, as the built-ins' Redis reads do); the chain then skips the per-phase deadline
    for phases where all plugins are bounded. Leave it False for your own plugins.
    """

    name: ClassVar[str] = ""
    bounded: ClassVar[bool] = False

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        return None

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        return None

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        return None

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None:
        return None

    async def stream_end(self, ctx: Context) -> None:
        return None

    @classmethod
    def hooks(cls) -> frozenset[Hook]:
        """The hooks this class overrides (the phases it needs from Envoy)."""
        return frozenset(h for h in HOOKS if getattr(cls, h) is not getattr(BasePlugin, h))
