"""The emulator's scheduler: one asyncio task stepping a continuous batch, as SGLang's does.

Each step (one forward pass of the emulated GPU):

1. every request whose prefill finished in an earlier step gets one KV slot for its next token;
   when the pool has none, requests are *retracted* as SGLang does (``kv_budget``): they free
   their KV, go back to the waiting queue, and later prefill prompt + output again;
2. give the step's prefill budget to requests still in prefill, oldest first (chunked prefill);
3. admit waiting requests in FCFS order while fewer than ``max_running_requests`` run, the
   step's prefill budget (``chunked_prefill_size`` uncached tokens) is not spent, and SGLang's
   optimistic KV budget holds (uncached prompt + ``max_new_tokens`` against free + evictable
   tokens minus ``new_token_ratio`` of what running requests may still produce); the uncached
   prompt and one output slot are allocated (evicting LRU cache leaves) and the matched prefix
   is locked so it cannot be evicted while the request runs;
4. sleep ``profile.step_s(prefill tokens, decode batch, …) * time_scale * slow`` (with the
   profile's context terms: each chunk's cached prefix, each stream's tokens so far), then publish
   the tokens. A request whose prefill completes in this step gets its first token now; its prompt
   is inserted into the radix cache (so concurrent requests with the same prefix hit), and on
   finish prompt + output are inserted and the lock released.

Prefill and decode share a step (mixed chunked prefill); the waiting queue is bounded as
SGLang's ``--max-queued-requests`` (``QueueFullError``, "The request queue is full." → 503;
retracted requests re-enter without that check). With priority scheduling on (``priority``) the
queue is sorted by priority each step, a full batch lets a more urgent request preempt running
ones (they recompute later, as retracted ones), and a full queue aborts its least urgent request
for a more urgent one. With no work the task waits on an event.

(Longer than CONVENTIONS' ~400 lines, on purpose: one class whose methods all move the same batch
state, KV reservations, cache locks and the two queues, step by step; the rules they apply, which
are pure, live apart: ``kv_budget``, ``priority``, ``waiting``, ``radix_cache``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from backends.emulator.kv_budget import (
    CLIP_MAX_NEW_TOKENS,
    NewTokenRatio,
    admits,
    decode_room,
    retraction_order,
    running_expectation,
)
from backends.emulator.lora import LoraSlots
from backends.emulator.observer import SchedulerObserver, SchedulerStats
from backends.emulator.priority import ABORTED_BY_PRIORITY, PriorityConfig, preemption_victims
from backends.emulator.radix_cache import RadixCache
from backends.emulator.request import EmuRequest
from backends.emulator.throughput import GenThroughput
from backends.emulator.tokenizer import OutputWords
from backends.emulator.waiting import WaitingQueue
from backends.errors import QueueFullError, RequestError, SchedulerAbortError, ServerClosingError
from backends.profiles import BackendProfile
from prefixindex.wire import KvEvent

__all__ = ["Scheduler", "SchedulerObserver", "SchedulerStats"]

log = logging.getLogger("backends.emulator")

_LATE_SLACK_S = 0.05  # behind schedule by less than this: catch up; more: start afresh
_QUEUE_FULL = "The request queue is full."  # SGLang's words


def _placed(req: EmuRequest) -> bool:
    """A PD decode server's request whose prompt KV came over the link (not computed here;
    after a retraction it is recomputed like any other)."""
    return req.kv_transferred and not req.recomputed


class Scheduler:
    """Continuous batching over a radix cache, timed by a ``BackendProfile``."""

    def __init__(
        self,
        profile: BackendProfile,
        *,
        time_scale: float = 1.0,
        server_seed: int = 0,
        stop_prob: float = 0.0,
        observer: SchedulerObserver | None = None,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        kv_sink: Callable[[list[KvEvent]], None] | None = None,
        priority: PriorityConfig | None = None,
        lora_slots: LoraSlots | None = None,
    ) -> None:
        self.profile = profile
        self.time_scale = time_scale
        self.slow_factor = 1.0
        self.server_seed = server_seed
        self.stop_prob = stop_prob
        self.cache = RadixCache(
            profile.max_total_tokens, profile.page_size, record_events=kv_sink is not None
        )
        self._kv_sink = kv_sink
        self.words = OutputWords.build()
        self._observer = observer
        self._clock = clock
        self._sleep = sleep
        self.priority = priority or PriorityConfig()
        self.waiting = WaitingQueue(profile.max_queued_requests, self.priority)
        self.running: list[EmuRequest] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._target = 0.0
        self._uncommitted = 0  # tokens computed by running requests, not yet in the tree
        self._tp = GenThroughput()
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.new_token_ratio = NewTokenRatio()
        self.retracted_total = 0
        self.lora_slots = lora_slots  # --max-loras-per-batch (lora.py); None: LoRA off
        self._lora_load_s = 0.0  # adapter loads of the batch being formed (added to its step)
        self.preempted_total = 0

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self.publish_kv_events()  # the AllBlocksCleared of a fresh cache, as SGLang's first batch
            self._task = asyncio.create_task(self._run(), name="emulator-scheduler")

    async def aclose(self) -> None:
        """Stop the step loop and abort every request."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            # a loop that died has logged its exception already (see _run)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        for req in [*self.waiting, *self.running]:
            self.abort(req)

    # ---- requests -----------------------------------------------------------------------
    def add(self, req: EmuRequest) -> EmuRequest:
        """Queue a request; QueueFullError when the waiting queue is full."""
        if self._closing:
            raise ServerClosingError("the emulator is shutting down")
        total = req.prompt_len + req.params.max_new_tokens
        if req.prompt_len == 0:
            raise RequestError("the prompt is empty", "prompt")
        if total > self.profile.max_total_tokens:
            raise RequestError(
                f"prompt ({req.prompt_len}) + max_new_tokens ({req.params.max_new_tokens}) "
                f"exceed the KV cache ({self.profile.max_total_tokens} tokens)"
            )
        try:
            resolved = self.priority.resolve(req.params.priority)
        except ValueError as exc:
            raise SchedulerAbortError(str(exc)) from exc
        req.priority = resolved if resolved is not None else 0
        if not self._enqueue(req):
            raise QueueFullError(_QUEUE_FULL)
        self._wake.set()
        return req

    def _enqueue(self, req: EmuRequest) -> bool:
        """Into the bounded queue (SGLang's _abort_on_queued_limit); False: refused."""
        queued, evicted = self.waiting.offer(req)
        if evicted is not None:
            self.abort(evicted, ABORTED_BY_PRIORITY)
        return queued

    def abort(self, req: EmuRequest, message: str | None = None) -> None:
        """Drop a request (client gone, shutdown, or ``message``: the scheduler's own abort,
        answered 503 with it); frees what it holds."""
        if req.done:
            return
        req.abort_message = message
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self._release(req, commit=req.prefill_done)
        req.finish_reason = "abort"
        req.finished_at = self._clock()
        if self._observer is not None:
            self._observer.on_finish(req, req.finished_at - req.arrival)
        req.event.set()

    def flush_cache(self) -> bool:
        """Empty the radix cache; False (nothing done) while requests run or wait."""
        if self.running or self.waiting:
            return False
        self.cache.reset()
        self.publish_kv_events()
        return True

    def publish_kv_events(self) -> None:
        """Hand the radix cache's events since the last call to the sink (one batch per step)."""
        if self._kv_sink is not None:
            events = self.cache.take_events()
            if events:
                self._kv_sink(events)

    def stats(self) -> SchedulerStats:
        cap = self.profile.max_total_tokens
        used = self.cache.protected_size + self._uncommitted
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_queue_reqs=len(self.waiting),
            num_used_tokens=used,
            max_total_num_tokens=cap,
            token_usage=used / cap,
            cache_hit_rate=(
                self.cached_tokens_total / self.prompt_tokens_total
                if self.prompt_tokens_total
                else 0.0
            ),
            gen_throughput=self._tp.value(),
            cached_tokens_in_tree=self.cache.total_size,
        )

    @property
    def healthy(self) -> bool:
        """False once the step loop has died (``/health`` then answers 503)."""
        return self._task is not None and not self._task.done()

    # ---- the step loop ------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            log.exception("emulator scheduler failed; aborting every request")
            for req in [*self.waiting, *self.running]:
                self.abort(req)
            raise

    async def _loop(self) -> None:
        while not self._closing:
            if not self.waiting and not self.running:
                self.new_token_ratio.reset()
                self._wake.clear()
                await self._wake.wait()
                self._target = self._clock()  # idle time is not a debt to catch up on
                continue
            prefill, decode = self._form_batch()
            # a PD decode server's prompt arrived as KV: placed, not computed
            prefill_tokens = sum(n for r, n in prefill if not _placed(r))
            if not prefill and not decode:
                # waiting requests that do not fit while nothing runs cannot happen (add()
                # rejects them); be safe and wait for a change instead of spinning
                self._wake.clear()
                await self._wake.wait()
                continue
            dt = self._step_time(prefill, prefill_tokens, decode) + self._lora_load_s
            self._lora_load_s = 0.0
            await self._sleep_step(dt * self.time_scale * self.slow_factor)
            self._apply(prefill, decode)
            self.publish_kv_events()

    def _step_time(
        self, prefill: list[tuple[EmuRequest, int]], prefill_tokens: int, decode: list[EmuRequest]
    ) -> float:
        """The profile's time for this step; its context terms see each chunk's cached prefix
        (``prefilled`` before the step) and each decoding stream's prompt and output so far."""
        if self.profile.context_free:
            return self.profile.step_s(prefill_tokens, len(decode))
        attended = sum(n * (r.prefilled + n / 2) for r, n in prefill if not _placed(r))
        kv = sum(req.prompt_len + req.output_len for req in decode)
        return self.profile.step_s(prefill_tokens, len(decode), kv, attended)

    async def _sleep_step(self, dt: float) -> None:
        now = self._clock()
        self._target = self._target + dt if now - self._target < _LATE_SLACK_S else now + dt
        await self._sleep(max(self._target - now, 0.0))

    def _form_batch(self) -> tuple[list[tuple[EmuRequest, int]], list[EmuRequest]]:
        decode = self._reserve_decode([r for r in self.running if r.prefill_done])
        budget = self.profile.chunked_prefill_size
        prefill: list[tuple[EmuRequest, int]] = []
        for req in self.running:
            if budget <= 0:
                break
            if not req.prefill_done:
                n = min(req.fill_len - req.prefilled, budget)
                prefill.append((req, n))
                budget -= 0 if _placed(req) else n
        ratio = self.new_token_ratio.value
        reserved = running_expectation(self.running, ratio)
        self.waiting.sort()
        preempted: list[EmuRequest] = []
        adapters = {r.params.lora for r in self.running if r.params.lora is not None}
        for req in list(self.waiting):
            if budget <= 0:
                break
            slots, lora = self.lora_slots, req.params.lora
            if slots is not None and not slots.fits(adapters, lora):
                continue  # SGLang: skipped while the batch holds max-loras-per-batch adapters
            if len(self.running) >= self.profile.max_running_requests:
                victims = self._preemption_victims(req, reserved) if self.priority.enabled else []
                if not victims:
                    break
                for victim in victims:
                    self._free_for_recompute(victim)
                reserved -= running_expectation(victims, ratio)
                preempted += victims
            taken = self._admit(req, reserved)
            if taken is None:
                break
            reserved += taken
            self.waiting.remove(req)
            self.running.append(req)
            if slots is not None and lora is not None:
                self._lora_load_s += slots.bring_in(lora, adapters)
                adapters.add(lora)
            n = min(req.fill_len - req.prefilled, budget)
            if _placed(req):  # the whole prompt arrives at once
                n = req.fill_len - req.prefilled
            prefill.append((req, n))
            budget -= 0 if _placed(req) else n
        if preempted:
            decode = [r for r in decode if r not in preempted]
            self._requeue_preempted(preempted)
        return prefill, decode

    def _preemption_victims(self, req: EmuRequest, reserved: float) -> list[EmuRequest]:
        fill = req.fill_ids
        uncached = len(fill) - self.cache.match_prefix(fill[: len(fill) - 1]).length
        decoding = [r for r in self.running if r.prefill_done]
        return preemption_victims(
            self.priority,
            req,
            uncached,
            decoding,
            self.cache.available - reserved,
            self.new_token_ratio.value,
        )

    def _requeue_preempted(self, preempted: list[EmuRequest]) -> None:
        """Back to the waiting queue through its bound (SGLang's _add_request_to_queue)."""
        self.preempted_total += len(preempted)
        for req in preempted:
            log.debug("preempted %s after %d output tokens", req.rid, len(req.output_ids))
            if not self._enqueue(req):
                self.abort(req, _QUEUE_FULL)

    def _reserve_decode(self, decode: list[EmuRequest]) -> list[EmuRequest]:
        """One KV slot per decoding request; retract requests (SGLang's order) when none is left."""
        if not decode:
            return decode
        if not self.cache.allocate(len(decode)):
            order = retraction_order(decode)
            first = True
            while len(order) > 1 and (
                first or not decode_room(self.cache.available, len(order), self.cache.page_size)
            ):
                self._retract(decode[order.pop()])
                first = False
            while order and not self.cache.allocate(len(order)):
                self._retract(decode[order.pop()])
            decode = [decode[i] for i in sorted(order)]
            self.new_token_ratio.after_retract(decode)
        else:
            self.new_token_ratio.decay()
        for req in decode:
            req.reserved += 1
        return decode

    def _retract(self, req: EmuRequest) -> None:
        """Free what ``req`` holds and queue it (unbounded) to prefill prompt + output."""
        self._free_for_recompute(req)
        self.waiting.push(req)
        self.retracted_total += 1
        log.debug("retracted %s after %d output tokens", req.rid, len(req.output_ids))

    def _free_for_recompute(self, req: EmuRequest) -> None:
        """Out of the batch, its KV freed (nothing inserted); it keeps its output so far."""
        self.running.remove(req)
        self._release(req, commit=False)
        req.recomputed = len(req.output_ids)
        req.prefilled = 0

    def _admit(self, req: EmuRequest, reserved: float) -> int | None:
        """Admit ``req`` if SGLang's budget allows; the tokens it takes from this step's budget."""
        fill = req.fill_ids
        match = self.cache.match_prefix(fill[: len(fill) - 1], req.params.lora_id)
        self.cache.lock(match.node)
        uncached = len(fill) - match.length
        remaining = req.params.max_new_tokens - len(req.output_ids)
        if not admits(uncached, remaining, self.cache.available, reserved) or not (
            self.cache.allocate(uncached + 1)
        ):
            self.cache.unlock(match.node)
            return None
        now = self._clock()
        req.node = match.node
        req.reserved = uncached + 1  # the uncached fill and the slot of the next token
        req.cached_tokens = match.length
        req.prefilled = match.length
        if req.admitted_at is None:
            req.admitted_at = now
            self.prompt_tokens_total += req.prompt_len
            self.cached_tokens_total += match.length
            if self._observer is not None:
                self._observer.on_admit(req, now - req.arrival)
        return uncached + min(max(remaining, 0), CLIP_MAX_NEW_TOKENS)

    def _apply(self, prefill: list[tuple[EmuRequest, int]], decode: list[EmuRequest]) -> None:
        now = self._clock()
        itls: list[float] = []
        produced = 0
        for req in decode:
            if req.done:
                continue
            if req.last_token_at is not None:
                itls.append(now - req.last_token_at)
            self._emit_token(req, now)
            produced += 1
        for req, n in prefill:
            if req.done:
                continue
            req.prefilled += n
            self._uncommitted += n
            if req.prefill_done:
                self._commit_prompt(req)
                if req.first_token_at is None:
                    req.first_token_at = now
                    if self._observer is not None:
                        self._observer.on_first_token(req, now - req.arrival)
                if req.params.max_new_tokens == 0:
                    req.finish_reason = "length"
                    continue
                self._emit_token(req, now)
                produced += 1
        self._tp.record(now, produced)
        if self._observer is not None and produced:
            self._observer.on_decode(produced, itls)
        finished = [r for r in self.running if r.finish_reason is not None]
        if finished:
            self.running = [r for r in self.running if r.finish_reason is None]
            for req in finished:
                self._release(req, commit=True)
                req.finished_at = now
                if self._observer is not None:
                    self._observer.on_finish(req, now - req.arrival)
                req.event.set()

    def _emit_token(self, req: EmuRequest, now: float) -> None:
        idx = req.rng.randrange(len(self.words.words))
        word = self.words.words[idx]
        req.last_token_at = now
        self._uncommitted += 1
        if word in req.params.stop:
            req.finish_reason, req.matched_stop = "stop", word
            return
        req.output_words.append(word)
        req.output_ids.append(self.words.ids[idx])
        if len(req.output_ids) >= req.params.max_new_tokens:
            req.finish_reason = "length"
        elif not req.params.ignore_eos and self.stop_prob and req.rng.random() < self.stop_prob:
            req.finish_reason = "stop"
        req.event.set()

    def _commit_prompt(self, req: EmuRequest) -> None:
        """Prefill done: move the fill (prompt, output so far) into the tree and lock it there."""
        # the tree takes whole pages: a partial last page stays the request's until its finish
        # (released earlier, the finish's insert of prompt + output grew the tree past capacity)
        req.held_tail = req.fill_len % self.cache.page_size
        moved = req.fill_len - req.cached_tokens - req.held_tail
        self.cache.release(moved)
        req.reserved -= moved
        self._uncommitted -= moved
        inserted = self.cache.insert(req.fill_ids, req.params.lora_id)
        self.cache.lock(inserted.node)
        if req.node is not None:
            self.cache.unlock(req.node)
        req.node = inserted.node

    def _release(self, req: EmuRequest, *, commit: bool) -> None:
        """Free the request's reservation; with ``commit`` insert prompt + output first."""
        self.cache.release(req.reserved)
        computed = req.prefilled - req.cached_tokens if not req.prefill_done else req.held_tail
        req.held_tail = 0
        outputs = len(req.output_ids) - req.recomputed  # recomputed ones went into the tree
        self._uncommitted -= computed + outputs + (req.matched_stop is not None)
        req.reserved = 0
        if commit and req.prefill_done:
            self.cache.insert([*req.params.prompt_ids, *req.output_ids], req.params.lora_id)
        if req.node is not None:
            self.cache.unlock(req.node)
            req.node = None
