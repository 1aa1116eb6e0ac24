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

With ``stop_at_budget: true`` the plugin also enforces the tenant's budget inside the stream
(docs/quotas.md, "The in-stream stop"): it counts the completion tokens each chunk serves
(``filters/plugins/usage/stop.py``), lets the stream pass its reservation only on tokens drawn from the
tenant's limits in blocks of ``topup_tokens`` (``quota/topup.lua``), and when a top-up is
refused ends the stream where the granted tokens end — a last chunk with ``finish_reason:
"length"``, the usage chunk when the client asked for it, ``[DONE]`` — drops what the backend
still sends, settles what was served, and asks the replica that answered (Envoy names it in
``x-tokenweir-upstream``, removed here) to abort the request (``filters/aborts.py``). A
non-streamed answer cannot be cut while it is generated: its bound is the backend's
``max_tokens``, so such a request reserves the prompt plus all of ``max_tokens``. Such a route
is metered here, never by Envoy's Lua meter (``policy.phases.stops_at_budget``).

Settings: ``max_json_bytes`` (default 8 MiB: larger JSON answers are not parsed);
``stop_at_budget`` (default false); ``topup_tokens`` (default 128: tokens drawn per top-up).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import Histogram

from filters.api import BasePlugin, Context, Result, Slot, Usage
from filters.errors import ConfigError
from filters.plugins.usage.stop import cut, generate_count, quick_count, stop_events, stream_head
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
from policy.model import Policy
from policy.phases import UPSTREAM_HEADER
from quota.config import tenant_defaults
from quota.cost import cost_usd, micro_usd, price_factor, price_for
from quota.errors import QuotaUnavailable
from quota.keys import record_key
from quota.topup import NO_RECORD
from wire.contract import RESERVE_HEADER, SETTLE_USD_KEY
from wire.jsontypes import JsonObject, JsonValue

__all__ = ["SETTLE_USD_KEY", "UsagePlugin"]

# SETTLE_USD_KEY (wire/contract.py), dynamic metadata: the real price the settle charges,
# micro-USD as a *string* (Envoy's metadata rate-limit action reads only string values; a number
# would yield its default "-"); re-exported here for the usage plugin's readers


_MAX_TAIL = 65536  # bytes of an incomplete SSE event kept between chunks
_CARRY = 5  # bytes of the previous chunk kept to see a "\ndata:" split across two chunks


@dataclass(slots=True)
class _State:
    sse: bool
    drop_usage: bool
    buf: bytearray
    ttft: Histogram  # the tenant, model and lane's timers (FilterMetrics.stream_timers)
    tbt: Histogram
    tail: bytes = b""
    last_event: bytes = b""
    first: float = 0.0
    last: float = 0.0
    chunks: int = 0
    events: int = 0
    too_big: bool = False
    # the in-stream stop: completion tokens granted (reservation + top-ups; None: not
    # enforced), served so far (quick count; /generate: its cumulative count), the first event
    stop: _Stop | None = None


@dataclass(slots=True)
class _Stop:
    kind: str
    granted: int
    served: int = 0
    carry: bytes = b"\n"
    head: JsonObject | None = None
    prefix: bytes = b""  # the stream's first bytes until its first event is whole
    hold: bytes = b""  # /generate: an event not yet whole, held until it is (then counted)
    body: bytes | None = None  # /generate: what passes of this chunk (its whole events)
    stopped: bool = False


_STATE: Slot[_State] = Slot("usage")  # what the response said so far
_UPSTREAM: Slot[str] = Slot("usage.upstream")  # the replica that answered: where an abort goes
_FACTOR: Slot[float] = Slot("usage.price_factor")  # batch.price_factor on a batch line, else 1


class UsagePlugin(BasePlugin):
    name = "usage"
    bounded = True

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        unknown = set(settings) - {"max_json_bytes", "stop_at_budget", "topup_tokens"}
        if unknown:
            raise ConfigError(f"usage: unknown setting(s) {sorted(unknown)}")
        limit = settings.get("max_json_bytes", 8 * 1024**2)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"usage: max_json_bytes must be a positive integer, got {limit!r}")
        stop = settings.get("stop_at_budget", False)
        if not isinstance(stop, bool):
            raise ConfigError(f"usage: stop_at_budget must be true or false, got {stop!r}")
        block = settings.get("topup_tokens", 128)
        if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= 1_000_000:
            raise ConfigError(
                f"usage: topup_tokens must be an integer from 1 to 1000000, got {block!r}"
            )
        self.max_json_bytes = limit
        self.stop_at_budget = stop
        self.topup_tokens = block
        self.services = services

    def _factor(self, ctx: Context) -> float:
        """The share of the prices this request pays (``batch.price_factor`` for a batch line),
        found once per request."""
        f = ctx.get(_FACTOR)
        if f is None:
            f = price_factor(self.services.policy, ctx.route.name)
            ctx.put(_FACTOR, f)
        return f

    def envoy_inputs(self, ctx: Context) -> JsonObject:
        """Dynamic metadata for Envoy's Lua usage meter (``controlplane/translate/usage.lua``):
        what this plugin would know at the response, and the model's prices."""
        kind = ctx.body.kind if ctx.body is not None else None
        out: JsonObject = {
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
        price = price_for(self.services.policy, ctx.model, self._factor(ctx))  # a batch line's
        if price is not None:
            out["price_prompt"] = price.prompt
            out["price_cached"] = price.prompt if price.cached is None else price.cached
            out["price_completion"] = price.completion
        return out

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        """A non-streamed answer cannot be stopped while it is generated (nothing passes before
        its end): with ``stop_at_budget`` it reserves the prompt plus all of ``max_tokens``, the
        backend's own bound, whatever smaller reservation the tokens plugin chose."""
        if not self.stop_at_budget or ctx.stream or ctx.reserve is None:
            return None
        if ctx.max_tokens is None or ctx.prompt_tokens is None:
            return None
        need = ctx.prompt_tokens + ctx.max_tokens
        if ctx.reserve >= need:
            return None
        ctx.reserve = need
        return Result(set_headers={RESERVE_HEADER: str(need)}, metadata={"reserve": need})

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        """The replica that answered (Envoy's ``x-tokenweir-upstream``): where an abort goes."""
        host = headers.get(UPSTREAM_HEADER)
        if host is None:
            return None
        ctx.put(_UPSTREAM, host)
        return Result(remove_headers=(UPSTREAM_HEADER,))

    def _start(self, ctx: Context, chunk: bytes) -> _State:
        sse = ctx.stream or chunk.lstrip().startswith((b"data:", b":", b"event:"))
        kind = ctx.body.kind if ctx.body is not None else None
        ttft, tbt = self.services.metrics.stream_timers(ctx.tenant, ctx.model, ctx.lane)
        st = _State(
            sse=sse,
            drop_usage=sse and ctx.stream and not ctx.client_wants_usage and kind != "generate",
            buf=bytearray(),
            ttft=ttft,
            tbt=tbt,
        )
        if (
            self.stop_at_budget
            and sse
            and ctx.route.rate_limited
            and ctx.tenant is not None
            and ctx.request_id
            and ctx.reserve is not None
        ):
            st.stop = _Stop(kind or "chat", ctx.reserve - (ctx.prompt_tokens or 0))
        ctx.put(_STATE, st)
        return st

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None:
        st = ctx.get(_STATE)
        if st is None:
            st = self._start(ctx, chunk)
        first = bool(chunk) and st.chunks == 0
        result = None
        sp = st.stop
        if sp is not None and (sp.stopped or chunk or sp.hold):
            result = await self._enforce(ctx, st, sp, chunk, end_of_stream)
            if result is not None:
                self._tick(ctx, st, chunk)
        if result is None:
            result = self._chunk(ctx, st, chunk, end_of_stream)
            if sp is not None and sp.body is not None:  # /generate: whole events only
                body, sp.body = sp.body, None
                result = Result(body=body, metadata=result.metadata if result else {})
        if not first:
            return result
        ttft = {"ttft_ms": round((st.first - ctx.started) * 1000, 1)}  # for the access log
        if result is None:
            return Result(metadata=ttft)
        return Result(body=result.body, metadata={**ttft, **result.metadata})

    def _tick(self, ctx: Context, st: _State, chunk: bytes) -> None:
        if chunk:
            now = self.services.clock()
            if st.chunks == 0:
                st.first = ctx.first_token_at = now
                st.ttft.observe(now - ctx.started)
            else:
                st.tbt.observe(now - st.last)
            st.last = now
            st.chunks += 1

    def _chunk(self, ctx: Context, st: _State, chunk: bytes, end_of_stream: bool) -> Result | None:
        self._tick(ctx, st, chunk)
        if st.sse:
            ctx.outcome = "ok"
            result = self._sse(ctx, st, chunk, end_of_stream)
            return self._produced(ctx, st, chunk, result) if ctx.usage is None else result
        if not st.too_big:
            st.buf += chunk
            if len(st.buf) > self.max_json_bytes:
                st.too_big, st.buf = True, bytearray()
        if not end_of_stream:
            return None
        ctx.outcome = _json_outcome(st)
        found = None if st.too_big else self._settle(ctx, usage_from_json(bytes(st.buf)))
        if found is None and ctx.usage is None and not _is_error(st):
            # an answer without usage (or too large to read): its cost is unknown, so the
            # worst case stays charged; an error answer keeps the 0 set at the request
            return Result(metadata={SETTLE_KEY: ctx.reserve or 0})
        return found

    async def _enforce(
        self, ctx: Context, st: _State, sp: _Stop, chunk: bytes, eos: bool
    ) -> Result | None:
        """None: the chunk passes as usual (its tokens are granted; ``/generate``: its whole
        events, ``sp.body``). Otherwise the chunk as the client gets it: cut where the granted
        tokens end, closed with the stop events; after the stop, every chunk is dropped (the
        backend was asked to abort)."""
        if sp.stopped:
            return Result(body=b"")
        generate = sp.kind == "generate"
        if generate:
            # an event's count is inside it (cumulative text, several tokens each): an event
            # split across chunks waits for its end, so it is counted before it passes
            joined = sp.hold + chunk
            end = joined.rfind(b"\n\n")
            if eos or (end < 0 and len(joined) > _MAX_TAIL):
                whole, sp.hold = joined, b""
            elif end < 0:
                whole, sp.hold = b"", joined
            else:
                whole, sp.hold = joined[: end + 2], joined[end + 2 :]
            if whole != chunk:
                sp.body = whole
            chunk = whole
        data = sp.carry + chunk
        if generate:
            count = generate_count(chunk)
            need = sp.served if count is None else max(sp.served, count)
        elif sp.head is None:  # the first chunk, read whole once: its role event is no token
            need = sp.served + cut(data, len(data), generate=False, at_line_start=False).tokens
        else:
            need = sp.served + quick_count(data)
        if sp.head is None:  # the first event, once whole (its id names the backend's rid)
            sp.prefix = (sp.prefix + chunk)[:_MAX_TAIL]
            sp.head = stream_head(sp.prefix)
        while need > sp.granted:
            got = await self._topup(ctx, sp, need - sp.granted)
            if got is None:  # no limit to draw from (no record): the stream runs unmetered
                st.stop = None
                if sp.hold:
                    sp.body, sp.hold = chunk + sp.hold, b""
                return None
            if got <= 0:
                break
            sp.granted += got
        if need <= sp.granted:
            sp.served = need
            sp.carry = data[-_CARRY:]
            return None
        room = sp.granted if generate else sp.granted - sp.served
        c = cut(data, room, generate=generate, at_line_start=False, served=sp.served)
        if not c.stopped:  # the quick count over-counted: every event fits
            sp.served = c.tokens if generate else sp.served + c.tokens
            sp.carry = data[-_CARRY:]
            return None
        served = c.tokens if generate else sp.served + c.tokens
        sp.body = None
        keep = max(0, c.keep - len(sp.carry))
        # bytes of an event the usage cut held back from the previous chunk (drop_usage) go
        # out now, before this chunk's part
        held, st.tail = (st.tail if st.drop_usage else b""), b""
        sent = data[: len(sp.carry)] + held + chunk[:keep] if held else data[: len(sp.carry) + keep]
        if generate and c.last is None:
            c_last = getattr(st, "last_event", b"")
            last: JsonValue = event_json(c_last) if c_last else None
        else:
            last = c.last
        prompt = ctx.prompt_tokens or 0
        closing = stop_events(
            sp.kind, sp.head, prompt, served, with_usage=ctx.client_wants_usage, last=last
        )
        out = held + chunk[:keep] + (b"" if sent.endswith(b"\n\n") else b"\n\n") + closing
        sp.stopped, sp.served = True, served
        m = self.services.metrics
        m.child(m.budget_stops, ctx.route.name, m.tenant_label(ctx.tenant)).inc()
        self._abort(ctx, sp)
        ctx.usage = None
        settled = self._settle(ctx, Usage(prompt, served))
        return Result(body=out, metadata=dict(settled.metadata) if settled else {})

    async def _topup(self, ctx: Context, sp: _Stop, short: int) -> int | None:
        """Tokens drawn from the tenant's limits (at least ``short``, in blocks), 0 when
        refused, None when there is no record to draw against. A store that cannot answer
        grants the block (fail-open, as the rate-limit service is without Redis)."""
        m = self.services.metrics
        tenant = m.tenant_label(ctx.tenant)
        want = max(self.topup_tokens, short)
        topups = self.services.topups
        if topups is None:
            m.child(m.topups, tenant, "error").inc()
            return want
        assert ctx.tenant is not None
        p1k = (
            micro_usd(self.services.policy, ctx.model, 0, 1000, factor=self._factor(ctx))
            if ctx.model
            else 0
        )
        try:
            res = await topups.topup(record_key(ctx.tenant, ctx.request_id), want, p1k)
        except QuotaUnavailable:
            m.child(m.topups, tenant, "error").inc()
            return want
        if res.status == NO_RECORD:
            if _limits_tokens(self.services.policy, ctx.tenant):
                # the tenant has a token limit, yet nothing was reserved: the rate-limit
                # service's call failed or timed out and Envoy let the request through
                # (failure_mode_deny false). The stream ends at what it would have reserved
                m.child(m.topups, tenant, "unreserved").inc()
                return 0
            m.child(m.topups, tenant, "no_record").inc()
            return None
        m.child(m.topups, tenant, "granted" if res.granted > 0 else "refused").inc()
        return res.granted

    def _abort(self, ctx: Context, sp: _Stop) -> None:
        head = sp.head or {}
        rid = head.get("id")
        if sp.kind == "generate":
            meta = head.get("meta_info")
            rid = meta.get("id") if isinstance(meta, dict) else None
        host = ctx.get(_UPSTREAM)
        aborts = self.services.aborts
        if not isinstance(rid, str) or not rid or host is None or aborts is None:
            m = self.services.metrics
            m.backend_aborts.labels("skipped").inc()
            return
        aborts.abort(host, rid)

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
        usd = micro_usd(self.services.policy, ctx.model, prompt, out, factor=self._factor(ctx))
        metadata: JsonObject = {SETTLE_KEY: prompt + out, SETTLE_USD_KEY: str(usd)}
        if result is None:
            return Result(metadata=metadata)
        return Result(body=result.body, metadata={**metadata, **result.metadata})

    def _sse(self, ctx: Context, st: _State, chunk: bytes, eos: bool) -> Result | None:
        if st.drop_usage and not st.tail and chunk.endswith(b"\n\n") and b'"usage"' not in chunk:
            return None  # the common case: whole events, none of them usage
        if not st.drop_usage:
            if ctx.body is not None and ctx.body.kind == "generate":
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
        policy, model, f = self.services.policy, ctx.model, self._factor(ctx)
        p, c, k = usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
        return Result(
            metadata={
                SETTLE_KEY: usage.total,
                SETTLE_USD_KEY: str(micro_usd(policy, model, p, c, k, f)),
                "prompt_tokens": p,
                "completion_tokens": c,
                "cached_tokens": k,
                "cost_usd": round(cost_usd(policy, model, p, c, k, f), 8),
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
        m.spent(
            ctx.tenant,
            ctx.model,
            cost_usd(self.services.policy, ctx.model, p, c, k, self._factor(ctx)),
        )
        st = ctx.get(_STATE)
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


def _limits_tokens(policy: Policy, tenant: str) -> bool:
    """Whether the policy gives ``tenant`` a token limit (its own or its tier's)."""
    fields = tenant_defaults(policy, tenant)
    return bool(fields) and any(k.startswith("tokens.") for k in fields or ())
