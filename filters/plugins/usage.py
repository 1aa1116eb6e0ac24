"""usage: real token counts from responses → ``tokenweir.settle_tokens`` and metrics.

JSON answers are read at their end; SSE streams are read as they pass. Chunks are never held
back: each is answered at once. When the client did not ask for ``include_usage`` (the tokens
plugin forced it upstream), the usage-only event is cut out of the chunk that carries it; to cut
cleanly the chunk is answered with its complete events and an incomplete trailing event (bytes
no SSE client can use yet) goes out with the next chunk.

Settings: ``max_json_bytes`` (default 8 MiB: larger JSON answers are not parsed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from filters.api import BasePlugin, Context, Result, Usage
from filters.errors import ConfigError
from filters.services import Services
from filters.sse import event_json, is_usage_only_event, split_events, usage_from_json, usage_of

__all__ = ["UsagePlugin"]

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

    def _start(self, ctx: Context, chunk: bytes) -> _State:
        sse = ctx.stream or chunk.lstrip().startswith((b"data:", b":", b"event:"))
        kind = getattr(ctx.body, "kind", None)
        ttft, tbt = self.services.metrics.stream_timers(ctx.tenant, ctx.model)
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
        if chunk:
            now = self.services.clock()
            if st.chunks == 0:
                st.first = now
                st.ttft.observe(now - ctx.started)
            else:
                st.tbt.observe(now - st.last)
            st.last = now
            st.chunks += 1
        if st.sse:
            return self._sse(ctx, st, chunk, end_of_stream)
        if not st.too_big:
            st.buf += chunk
            if len(st.buf) > self.max_json_bytes:
                st.too_big, st.buf = True, bytearray()
        if end_of_stream and not st.too_big:
            return self._settle(ctx, usage_from_json(bytes(st.buf)))
        return None

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
        return Result(metadata={"settle_tokens": usage.total})

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
        st: _State | None = ctx.scratch.get("usage")
        if st is not None and st.chunks > 1 and st.last > st.first and u.completion_tokens > 1:
            m.tokens_per_second.labels(tenant, model).observe(
                (u.completion_tokens - 1) / (st.last - st.first)
            )
        if ctx.prompt_tokens and u.prompt_tokens:
            m.estimate_ratio.labels(model).observe(ctx.prompt_tokens / u.prompt_tokens)


def _tail_after_events(data: bytes) -> bytes:
    """The incomplete event at the end of ``data`` (kept only so a split usage event is seen)."""
    end = data.replace(b"\r\n", b"\n").rfind(b"\n\n")
    tail = data if end < 0 else data.replace(b"\r\n", b"\n")[end + 2 :]
    return tail[-_MAX_TAIL:]
