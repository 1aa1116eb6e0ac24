"""usage: real token counts from responses → ``tokenweir.settle_tokens`` and metrics.

JSON answers are read at their end; SSE streams are read as they pass. Settlement is truthful:
the filter server sets ``settle_tokens`` to 0 at the request (so an upstream error, or a client
gone before any output, settles 0); while a stream runs, each chunk updates it to what has been
produced so far (the prompt plus one token per event, at most ``max_tokens``), so a stream the
client abandons, or that breaks, settles that; the usage the backend reports replaces the
estimate. A JSON answer without usage keeps the worst case (its cost is unknown). Chunks are never held
back: each is answered at once. When the client did not ask for ``include_usage`` (the tokens
plugin forced it upstream), the usage-only event is cut out of the chunk that carries it; to cut
cleanly the chunk is answered with its complete events and an incomplete trailing event (bytes
no SSE client can use yet) goes out with the next chunk.

On a route Envoy's Lua usage meter covers (``RouteInfo.metered_in_envoy``: no other plugin
reads the response body), Envoy does all of the above itself (``controlplane/translate/usage.lua``)
and this plugin only hands it its inputs (:meth:`UsagePlugin.envoy_inputs`, set as dynamic
metadata at the request body); the metrics come back through the access log
(``filters/usage_log.py``). ``tests/integration/test_usage_twin.py`` drives both meters with the
same streams and demands the same settlement and bytes.

Settings: ``max_json_bytes`` (default 8 MiB: larger JSON answers are not parsed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from filters.api import BasePlugin, Context, Result, Usage
from filters.errors import ConfigError
from filters.services import Services
from filters.sse import (
    SETTLE_KEY,
    count_events,
    event_json,
    is_usage_only_event,
    split_events,
    usage_from_json,
    usage_of,
)
from runtime.cost import cost_usd, micro_usd

__all__ = ["METERED", "OUTCOME_KEY", "SETTLE_USD_KEY", "UsagePlugin"]

# dynamic metadata: the real price the settle charges, micro-USD as a *string* (Envoy's metadata
# rate-limit action reads only string values; a number would yield its default "-")
SETTLE_USD_KEY = "settle_usd_micros"

OUTCOME_KEY = "outcome"  # ctx.scratch: how the answer ended (tokenweir_filters_requests_total)
METERED = "metered_in_envoy"  # ctx.scratch: Envoy's usage meter reports this request

_MAX_TAIL = 65536  # bytes of an incomplete SSE event kept between chunks


@dataclass(slots=True)
class _State:
    sse: bool
    drop_usage: bool
    buf: bytearray
    tail: bytes = b""
    last_event: bytes = b""
    first: float = 0.0
    last: float = 0.0
    chunks: int = 0
    events: int = 0
    too_big: bool = False
    ttft: Any = None
    tbt: Any = None


class UsagePlugin(BasePlugin):
    name = "usage"
    bounded = True

    def __init__(self, settings: Mapping[str, Any], services: Services) -> None:
        unknown = set(settings) - {"max_json_bytes"}
        if unknown:
            raise ConfigError(f"usage: unknown setting(s) {sorted(unknown)}")
        limit = settings.get("max_json_bytes", 8 * 1024**2)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"usage: max_json_bytes must be a positive integer, got {limit!r}")
        self.max_json_bytes = limit
        self.services = services

    def envoy_inputs(self, ctx: Context) -> dict[str, Any]:
        """Dynamic metadata for Envoy's Lua usage meter (``controlplane/translate/usage.lua``):
        what this plugin would know at the response, and the model's prices."""
        kind = getattr(ctx.body, "kind", None)
        out: dict[str, Any] = {
            "meter": True,
            "route": ctx.route.name,
            "prompt": ctx.prompt_tokens or 0,
            "max_tokens": ctx.max_tokens or 0,
            "stream": ctx.stream,
            "cut": ctx.stream and not ctx.client_wants_usage and kind != "generate",
            "reserve": ctx.reserve or 0,
            "json_max": self.max_json_bytes,
        }
        if ctx.model is not None:
            out["model"] = ctx.model
        if ctx.route.pool is not None:
            out["pool"] = ctx.route.pool
        prices = getattr(self.services.policy, "prices", None) or {}
        price = prices.get(ctx.model) if ctx.model is not None else None
        if price is not None:
            out["price_prompt"] = price.prompt
            out["price_cached"] = price.prompt if price.cached is None else price.cached
            out["price_completion"] = price.completion
        return out

    def _start(self, ctx: Context, chunk: bytes) -> _State:
        sse = ctx.stream or chunk.lstrip().startswith((b"data:", b":", b"event:"))
        kind = getattr(ctx.body, "kind", None)
        ttft, tbt = self.services.metrics.stream_timers(ctx.tenant, ctx.model, ctx.lane)
        st = _State(
            sse=sse,
            drop_usage=sse and ctx.stream and not ctx.client_wants_usage and kind != "generate",
            buf=bytearray(),
            ttft=ttft,
            tbt=tbt,
        )
        ctx.scratch["usage"] = st
        return st

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None:
        st: _State | None = ctx.scratch.get("usage")
        if st is None:
            st = self._start(ctx, chunk)
        first = bool(chunk) and st.chunks == 0
        result = self._chunk(ctx, st, chunk, end_of_stream)
        if not first:
            return result
        ttft = {"ttft_ms": round((st.first - ctx.started) * 1000, 1)}  # for the access log
        if result is None:
            return Result(metadata=ttft)
        return Result(body=result.body, metadata={**ttft, **result.metadata})

    def _chunk(self, ctx: Context, st: _State, chunk: bytes, end_of_stream: bool) -> Result | None:
        if chunk:
            now = self.services.clock()
            if st.chunks == 0:
                st.first = ctx.first_token_at = now
                st.ttft.observe(now - ctx.started)
            else:
                st.tbt.observe(now - st.last)
            st.last = now
            st.chunks += 1
        if st.sse:
            ctx.scratch[OUTCOME_KEY] = "ok"
            result = self._sse(ctx, st, chunk, end_of_stream)
            return self._produced(ctx, st, chunk, result) if ctx.usage is None else result
        if not st.too_big:
            st.buf += chunk
            if len(st.buf) > self.max_json_bytes:
                st.too_big, st.buf = True, bytearray()
        if not end_of_stream:
            return None
        ctx.scratch[OUTCOME_KEY] = _json_outcome(st)
        found = None if st.too_big else self._settle(ctx, usage_from_json(bytes(st.buf)))
        if found is None and ctx.usage is None and not _is_error(st):
            # an answer without usage (or too large to read): its cost is unknown, so the
            # worst case stays charged; an error answer keeps the 0 set at the request
            return Result(metadata={SETTLE_KEY: ctx.reserve or 0})
        return found

    def _produced(
        self, ctx: Context, st: _State, chunk: bytes, result: Result | None
    ) -> Result | None:
        """What a stream cut short has cost so far: the prompt once output began, plus one token
        per event seen (SGLang sends one decode step per event), at most ``max_tokens``."""
        st.events += count_events(chunk)
        if st.events == 0:
            return result
        out = min(st.events, ctx.max_tokens) if ctx.max_tokens else st.events
        prompt = ctx.prompt_tokens or 0
        usd = micro_usd(self.services.policy, ctx.model, prompt, out)
        metadata = {SETTLE_KEY: prompt + out, SETTLE_USD_KEY: str(usd)}
        if result is None:
            return Result(metadata=metadata)
        return Result(body=result.body, metadata={**metadata, **result.metadata})

    def _sse(self, ctx: Context, st: _State, chunk: bytes, eos: bool) -> Result | None:
        if st.drop_usage and not st.tail and chunk.endswith(b"\n\n") and b'"usage"' not in chunk:
            return None  # the common case: whole events, none of them usage
        if not st.drop_usage:
            if ctx.body is not None and getattr(ctx.body, "kind", None) == "generate":
                return self._generate(ctx, st, chunk, eos)
            data = st.tail + chunk if st.tail else chunk
            if b'"usage"' not in data:  # the word may straddle two chunks: look at both
                st.tail = _tail_after_events(data)
                return None
        events, tail = split_events(st.tail + chunk)
        if (eos or len(tail) > _MAX_TAIL) and tail:  # never hold back more than one big event
            events.append(tail)
            tail = b""
        st.tail = tail
        usage: Usage | None = None
        kept: list[bytes] = []
        for ev in events:
            obj = event_json(ev) if b'"usage"' in ev else None
            found = usage_of(obj) if obj is not None else None
            if found is not None:
                usage = found
                if st.drop_usage and is_usage_only_event(obj):
                    continue
            kept.append(ev)
        result = self._settle(ctx, usage) if usage is not None else None
        if st.drop_usage:
            out = b"".join(kept)
            if out != chunk:
                return Result(body=out, metadata=result.metadata if result else {})
        return result

    def _generate(self, ctx: Context, st: _State, chunk: bytes, eos: bool) -> Result | None:
        events, st.tail = split_events(st.tail + chunk)
        for ev in events:
            if b"meta_info" in ev:
                st.last_event = ev
        if (eos or any(b"[DONE]" in ev for ev in events)) and st.last_event:
            ev, st.last_event = st.last_event, b""
            return self._settle(ctx, usage_of(event_json(ev)))
        return None

    def _settle(self, ctx: Context, usage: Usage | None) -> Result | None:
        # a running usage on every chunk (stream_options.continuous_usage_stats) grows: the
        # largest is the real cost, and a later metadata value replaces an earlier one in Envoy
        if usage is None or (ctx.usage is not None and usage.total <= ctx.usage.total):
            return None
        ctx.usage = usage
        policy, model = self.services.policy, ctx.model
        p, c, k = usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
        return Result(
            metadata={
                SETTLE_KEY: usage.total,
                SETTLE_USD_KEY: str(micro_usd(policy, model, p, c, k)),
                "prompt_tokens": p,
                "completion_tokens": c,
                "cached_tokens": k,
                "cost_usd": round(cost_usd(policy, model, p, c, k), 8),
            }
        )

    async def stream_end(self, ctx: Context) -> None:
        u = ctx.usage
        if u is None:
            return
        m = self.services.metrics
        tenant, model = ctx.tenant or "unknown", ctx.model or "unknown"
        prompt, completion, cached = m.token_counters(tenant, model)
        prompt.inc(u.prompt_tokens)
        completion.inc(u.completion_tokens)
        cached.inc(u.cached_tokens)
        p, c, k = u.prompt_tokens, u.completion_tokens, u.cached_tokens
        m.spent(ctx.tenant, ctx.model, cost_usd(self.services.policy, ctx.model, p, c, k))
        st: _State | None = ctx.scratch.get("usage")
        if st is not None and st.chunks > 1 and st.last > st.first and u.completion_tokens > 1:
            m.tokens_per_second.labels(tenant, model).observe(
                (u.completion_tokens - 1) / (st.last - st.first)
            )
        if ctx.prompt_tokens and u.prompt_tokens:
            m.estimate_ratio.labels(model).observe(ctx.prompt_tokens / u.prompt_tokens)


def _is_error(st: _State) -> bool:
    """An error answer (OpenAI's or SGLang's JSON error, or not JSON at all): nothing produced."""
    head = bytes(st.buf[:4096]).lstrip()
    return not st.too_big and (not head.startswith((b"{", b"[")) or b'"error"' in head)


def _json_outcome(st: _State) -> str:
    """ok, or error / rate_limited for an error answer (the rate-limit service's 429 body says
    ``rate_limit_exceeded``; the usage plugin sees no status line, only the body)."""
    if not _is_error(st):
        return "ok"
    head = bytes(st.buf[:4096])
    return "rate_limited" if b"rate_limit_exceeded" in head else "error"


def _tail_after_events(data: bytes) -> bytes:
    """The incomplete event at the end of ``data`` (kept only so a split usage event is seen)."""
    end = data.replace(b"\r\n", b"\n").rfind(b"\n\n")
    tail = data if end < 0 else data.replace(b"\r\n", b"\n")[end + 2 :]
    return tail[-_MAX_TAIL:]
