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

No backend request left behind (docs/batch.md, "Exactly once"): on a route to a pool the
request's body gets a fresh ``rid`` (SGLang's request id, kept in the claim), and the claim has a
*lease* this filter server renews every ``lease / 3`` while the request runs.

* a client (or Envoy) gone before any answer came, or mid-stream: the backend request is aborted by its ``rid``
  at every replica of the pool, and only then is the key freed (a retry cannot overlap it);
  an abort not confirmed leaves the claim to lapse, so the next holder aborts it again;
* a claim whose holder died (its lease lapsed): the next request with the key aborts the
  orphan's backend request the same way, then takes the claim over (``takeover``);
* what cannot be undone is counted: the backend had answered (a non-streamed answer's headers
  came back) but the answer never reached the store — the holder died (``rerun_answered``, at
  the takeover) or the client went (``answer_lost``) — so the retry is the second backend run.

The stored stream keeps the usage event the tokens plugin forced upstream; a replay to a client
that did not ask for it cuts it out again (the fingerprint is the same, so the body is too).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from filters.api import BasePlugin, Context, Reply, Result, Slot, openai_error
from filters.bodies import json_of, kind_for_path, write_body
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
from filters.plugins.idempotency.store import AnswerStore, Claimed, MemoryStore, RedisStore
from filters.services import Services
from filters.sse import event_json, is_usage_only_event, split_events
from wire.contract import IDEMPOTENCY_IN_USE, IDEMPOTENCY_UNSTORED
from wire.jsontypes import JsonObject

__all__ = ["REPLAYED_HEADER", "IdempotencyPlugin"]

REPLAYED_HEADER = "idempotent-replayed"


@dataclass(slots=True)
class _Claim:
    key: str
    claim: bytes
    fingerprint: str
    owner: str = ""
    rid: str = ""  # the backend request id given in the body ("" : none could be given)
    renewer: asyncio.Task[None] | None = None
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
        self._abort_timeout = timeout
        self._owners = itertools.count()
        self._marks: set[asyncio.Task[None]] = set()  # answered marks in flight

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
        owner = f"{ctx.request_id}/{next(self._owners)}"
        sent = _with_rid(ctx, body, _new_rid(skey)) if self._hosts(ctx) else None
        rid = sent[1] if sent is not None else ""
        claim = encode_entry(Entry("inflight", fp, owner, rid=rid))
        ttl, lease = self.policy.inflight_ttl, self.policy.lease
        try:
            got = await self.store.claim(skey, claim, ttl, lease)
        except StoreUnavailable:
            self._count(ctx, "store_error")
            if self.policy.on_store_error == "run":
                return None
            return Result(reply=_unavailable())
        decision = Decision("run")
        if got is not None:
            entry, alive = _found(got)
            decision = decide(entry, fp, alive)
        if decision.verdict == "take_over":
            decision = await self._take_over(ctx, skey, got, claim)
        if decision.verdict not in ("run", "take_over"):
            return Result(reply=self._answer(ctx, decision, body))
        c = _Claim(skey, claim, fp, owner, rid)
        c.renewer = asyncio.get_running_loop().create_task(self._renew(c))
        ctx.put(_CLAIM, c)
        self._count(ctx, "claimed")
        if sent is None:
            return None
        return Result(set_headers={"content-length": str(len(sent[0]))}, body=sent[0])

    async def _take_over(
        self, ctx: Context, skey: str, got: Claimed | None, claim: bytes
    ) -> Decision:
        """A dead holder's claim: abort its backend request everywhere, then take the claim
        (``take_over``); while that cannot be made sure of, the request waits (``in_flight``)."""
        assert got is not None
        old = decode_entry(got.entry)
        assert old is not None
        if not await self._abort(ctx, old.rid):
            self._count(ctx, "orphan_unaborted")
            return Decision("in_flight", old)
        try:
            took = await self.store.take_over(
                skey, got.entry, claim, self.policy.inflight_ttl, self.policy.lease
            )
        except StoreUnavailable:
            self._count(ctx, "store_error")
            took = False
        if not took:  # another request took it first
            return Decision("in_flight", old)
        self._count(ctx, "takeover")
        if got.answered:  # the orphan's answer had come back: this run is the second
            self._count(ctx, "rerun_answered")
        return Decision("take_over", old)

    def _hosts(self, ctx: Context) -> tuple[str, ...]:
        """The replicas a request of this route may run on (where an abort goes); none on a
        path without an LLM body."""
        pool = self.services.policy.pools.get(ctx.route.pool) if ctx.route.pool else None
        if pool is None or kind_for_path(ctx.path) is None:
            return ()
        return tuple(f"{ep.host}:{ep.port}" for ep in pool.endpoints)

    async def _abort(self, ctx: Context, rid: str) -> bool:
        """The backend request ``rid`` runs nowhere any more (every replica answered the abort)."""
        aborts, hosts = self.services.aborts, self._hosts(ctx)
        if aborts is None or not hosts or not rid:
            return False
        return await aborts.abort_everywhere(hosts, rid, self._abort_timeout)

    async def _renew(self, c: _Claim) -> None:
        """The holder's heartbeat: the claim's lease renewed until the request ends."""
        every = self.policy.lease / 3
        while True:
            await asyncio.sleep(every)
            # a store error: the next beat tries again (a lease that lapses meanwhile is taken
            # over, its request aborted first)
            with contextlib.suppress(StoreUnavailable):
                await self.store.renew(c.key, c.claim, self.policy.lease)

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
                code=IDEMPOTENCY_IN_USE,
                headers={"retry-after": str(wait)},
                details="tokenweir_idempotency_in_flight",
            )
        if decision.verdict == "unstored":
            return openai_error(
                409,
                f"the request with this {self.policy.header} has finished, but its answer was "
                "larger than the gateway stores for replay; it is not run again",
                code=IDEMPOTENCY_UNSTORED,
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
            if c.rid and 200 <= c.status < 300 and not ctx.stream:
                task = asyncio.get_running_loop().create_task(self._mark_answered(c))
                self._marks.add(task)
                task.add_done_callback(self._marks.discard)
        return None

    async def _mark_answered(self, c: _Claim) -> None:
        """A non-streamed answer's headers: the backend has finished the request. Noted beside
        the claim, so a takeover after this holder dies knows its rerun is a second run; off
        the answer's path (a slow store must not hold the answer past Envoy's message timeout)."""
        with contextlib.suppress(StoreUnavailable):
            await self.store.mark_answered(c.key, c.claim, self.policy.inflight_ttl)

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
        if c.renewer is not None:
            c.renewer.cancel()
        try:
            if not (c.complete and 200 <= c.status < 300):
                running = c.status == 0 or (ctx.stream and 200 <= c.status < 300)
                if running and ctx.status is None and c.rid:
                    # gone before any answer, or mid-stream: the backend may still run it; free
                    # the key only once it runs nowhere (else the lease lapses and a retry
                    # aborts it again)
                    if not await self._abort(ctx, c.rid):
                        self._count(ctx, "abort_failed")
                        return
                    self._count(ctx, "orphan_aborted")
                elif 200 <= c.status < 300:
                    self._count(ctx, "answer_lost")  # the backend answered; a retry reruns it
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


def _found(got: Claimed) -> tuple[Entry, bool]:
    """The entry a claim found and whether its holder lives; bytes this code did not write
    read as a conflict (an entry of no fingerprint)."""
    entry = decode_entry(got.entry)
    if entry is None:
        return Entry("inflight", "", ""), True
    return entry, got.holder_alive


def _new_rid(skey: str) -> str:
    """A backend request id for one run under ``skey``: the key's digest (so a run can be
    traced to its key) and a fresh part (two runs never share an id)."""
    return f"idem-{skey.rsplit(':', 1)[-1][:16]}-{secrets.token_hex(6)}"


def _with_rid(ctx: Context, body: bytes, rid: str) -> tuple[bytes, str] | None:
    """The body with ``"rid": rid`` (SGLang's request id) set, and the rid; None for a body
    that is no JSON object (it runs without one). A body that has no ``rid`` yet gets it
    spliced in after its ``{`` (no re-encoding of a large prompt); one that has it is parsed."""
    head = body.lstrip()
    if not head.startswith(b"{"):
        return None
    if b'"rid"' in body:
        obj = json_of(ctx, body)  # the request's one decode (filters.bodies), kept for the rest
        if obj is None:
            return None
        obj["rid"] = rid
        return write_body(ctx, obj), rid
    rest = head[1:].lstrip()
    sep = b"" if rest.startswith(b"}") else b","
    return b'{"rid":' + json.dumps(rid).encode() + sep + rest, rid


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
