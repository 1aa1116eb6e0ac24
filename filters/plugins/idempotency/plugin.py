"""idempotency: ``Idempotency-Key`` on LLM routes (IETF httpapi draft semantics).

Put it right after ``identity`` (the key is scoped by tenant) and before ``tokens`` (the body
fingerprint is taken from the body as the client sent it, before any clamp rewrites it):

* first request with a key: claimed in the store (``inflight``) and served; a finished 2xx answer
  is stored for ``idempotency.ttl`` (JSON, or the SSE stream exactly as recorded), any other
  outcome frees the key so a retry runs again;
* same key, same tenant, same fingerprint, finished: the answer is replayed at the request body
  phase, before the rate-limit filter, so the retry reaches no backend and is not charged
  (header ``idempotent-replayed: true``);
* same key while the first request still runs: ``409`` (``idempotency_key_in_use``) with
  ``Retry-After`` — not joined (a request joined in flight is what ``collapse`` does);
* same key, other body or path: ``422`` (``idempotency_key_reused``);
* an answer over ``max_response_bytes``: remembered as finished but not stored; a retry gets
  ``409`` (``idempotency_answer_not_stored``), never a second run.

The stored stream keeps the usage event the tokens plugin forced upstream; a replay to a client
that did not ask for it cuts it out again (the fingerprint is the same, so the body is too).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from filters.api import BasePlugin, Context, Reply, Result, Slot, openai_error
from filters.bodies import json_of
from filters.errors import ClientError, ConfigError
from filters.plugins.idempotency.errors import StoreUnavailable
from filters.plugins.idempotency.record import (
    Decision,
    Entry,
    State,
    decide,
    decode_entry,
    encode_entry,
    fingerprint,
    parse_key,
    store_key,
)
from filters.plugins.idempotency.store import AnswerStore, MemoryStore, RedisStore
from filters.services import Services
from filters.sse import event_json, is_usage_only_event, split_events
from wire.jsontypes import JsonObject

__all__ = ["REPLAYED_HEADER", "IdempotencyPlugin"]

REPLAYED_HEADER = "idempotent-replayed"


@dataclass(slots=True)
class _Claim:
    key: str
    claim: bytes
    fingerprint: str
    status: int = 0
    content_type: str = ""
    body: bytearray = field(default_factory=bytearray)
    too_big: bool = False
    complete: bool = False


_KEY: Slot[str] = Slot("idempotency.key")  # the client's key, until the body claims it
_CLAIM: Slot[_Claim] = Slot("idempotency.claim")  # the claim this request runs under


class IdempotencyPlugin(BasePlugin):
    name = "idempotency"
    bounded = True  # its only I/O, the store, has its own timeout

    def __init__(self, settings: Mapping[str, object], services: Services) -> None:
        if settings:
            raise ConfigError(
                f"idempotency: unknown setting(s) {sorted(settings)}; its knobs live in the "
                "policy's 'idempotency' section"
            )
        self.policy = services.policy.idempotency
        self.services = services
        redis = getattr(services, "redis", None)
        timeout = services.policy.filters.message_timeout / 2 if services.policy.filters else 0.1
        self.store: AnswerStore = (
            RedisStore(redis, timeout=timeout) if redis is not None else MemoryStore(services.clock)
        )
        self._owners = itertools.count()

    def _count(self, ctx: Context, outcome: str) -> None:
        self.services.metrics.idempotency.labels(ctx.route.name, outcome).inc()

    async def request_headers(
        self, ctx: Context, headers: Mapping[str, str], end_of_stream: bool
    ) -> Result | None:
        raw = headers.get(self.policy.header)
        if raw is None:
            if self.policy.require and headers.get(":method", "POST") == "POST":
                self._count(ctx, "missing")
                raise ClientError(
                    400, f"this route requires an {self.policy.header} header",
                    reason="idempotency_key_missing", code="idempotency_key_missing",
                )  # fmt: skip
            return None
        key = parse_key(raw, self.policy.max_key_length)
        if key is None:
            self._count(ctx, "invalid")
            raise ClientError(
                400,
                f"{self.policy.header} must be 1-{self.policy.max_key_length} visible ASCII "
                'characters (an sf-string such as "4f1c...")',
                reason="idempotency_key_invalid",
                code="idempotency_key_invalid",
            )
        ctx.put(_KEY, key)
        return None

    async def request_body(self, ctx: Context, body: bytes) -> Result | None:
        key = ctx.take(_KEY)  # from here on the claim (if any) stands for it
        if key is None:
            return None
        fp = fingerprint(ctx.method or "POST", ctx.path, body)
        skey = store_key(ctx.tenant or "anonymous", key)
        claim = encode_entry(Entry("inflight", fp, f"{ctx.request_id}/{next(self._owners)}"))
        try:
            raw = await self.store.claim(skey, claim, self.policy.inflight_ttl)
        except StoreUnavailable:
            self._count(ctx, "store_error")
            if self.policy.on_store_error == "run":
                return None
            return Result(reply=_unavailable())
        existing = decode_entry(raw) if raw is not None else None
        if raw is not None and existing is None:  # not ours to read: treat as a conflict
            existing = Entry("inflight", "", "")
        decision = decide(existing, fp)
        if decision.verdict == "run":
            ctx.put(_CLAIM, _Claim(skey, claim, fp))
            self._count(ctx, "claimed")
            return None
        return Result(reply=self._answer(ctx, decision, body))

    def _answer(self, ctx: Context, decision: Decision, body: bytes) -> Reply:
        entry = decision.entry
        assert entry is not None
        self._count(ctx, decision.verdict)
        if decision.verdict == "mismatch":
            return openai_error(
                422,
                f"this {self.policy.header} was used with another request body or path; "
                "use a new key for a new request",
                code="idempotency_key_reused",
                details="tokenweir_idempotency_mismatch",
            )
        if decision.verdict == "in_flight":
            wait = max(1, round(self.policy.retry_after))
            return openai_error(
                409,
                f"a request with this {self.policy.header} is still running; retry after {wait}s "
                "to get its answer",
                code="idempotency_key_in_use",
                headers={"retry-after": str(wait)},
                details="tokenweir_idempotency_in_flight",
            )
        if decision.verdict == "unstored":
            return openai_error(
                409,
                f"the request with this {self.policy.header} has finished, but its answer was "
                "larger than the gateway stores for replay; it is not run again",
                code="idempotency_answer_not_stored",
                details="tokenweir_idempotency_unstored",
            )
        self.services.metrics.tokens_saved.labels(ctx.route.name, "idempotency").inc(entry.tokens)
        out = entry.body
        if entry.content_type.startswith("text/event-stream") and not _wants_usage(
            json_of(ctx, body)
        ):
            out = _without_usage_events(out)
        return Reply(
            status=entry.status,
            body=out,
            headers={"content-type": entry.content_type, REPLAYED_HEADER: "true"},
            details="tokenweir_idempotency_replay",
        )

    async def response_headers(self, ctx: Context, headers: Mapping[str, str]) -> Result | None:
        c = ctx.get(_CLAIM)
        if c is not None:
            try:
                c.status = int(headers.get(":status", "0"))
            except ValueError:
                c.status = 0
            c.content_type = headers.get("content-type", "")
        return None

    async def response_chunk(
        self, ctx: Context, chunk: bytes, end_of_stream: bool
    ) -> Result | None:
        c = ctx.get(_CLAIM)
        if c is None:
            return None
        if not c.too_big:
            c.body += chunk
            if len(c.body) > self.policy.max_response_bytes:
                c.too_big, c.body = True, bytearray()
        if end_of_stream:
            c.complete = True
        return None

    async def stream_end(self, ctx: Context) -> None:
        c = ctx.take(_CLAIM)
        if c is None:
            return
        try:
            if not (c.complete and 200 <= c.status < 300):
                await self.store.release(c.key, c.claim)
                self._count(ctx, "released")
                return
            tokens = ctx.usage.total if ctx.usage is not None else 0
            state: State = "unstored" if c.too_big else "done"
            entry = Entry(
                state, c.fingerprint, "", c.status, c.content_type, tokens,
                b"" if c.too_big else bytes(c.body),
            )  # fmt: skip
            await self.store.finish(c.key, c.claim, encode_entry(entry), self.policy.ttl)
            self._count(ctx, "stored" if state == "done" else "too_large")
        except StoreUnavailable:
            # the claim expires after inflight_ttl; until then a retry gets 409, never a rerun
            self._count(ctx, "store_error")


def _unavailable() -> Reply:
    return openai_error(
        503,
        "the gateway cannot check idempotency keys right now; retry after 1s",
        error_type="server_error",
        code="idempotency_store_unavailable",
        headers={"retry-after": "1"},
        details="tokenweir_idempotency_store",
    )


def _wants_usage(obj: JsonObject | None) -> bool:
    opts = obj.get("stream_options") if obj is not None else None
    return isinstance(opts, dict) and opts.get("include_usage") is True


def _without_usage_events(stream: bytes) -> bytes:
    events, tail = split_events(stream)
    kept = [e for e in events if b'"usage"' not in e or not is_usage_only_event(event_json(e))]
    return b"".join(kept) + tail
