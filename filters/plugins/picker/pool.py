"""One pool's picker at run time: prefix index + KV-event subscriber + checkpoint map + load.

``PoolPicker`` owns its background tasks (the subscriber's, the mapper, the gauge refresher) and
the mapper's worker process; ``aclose()`` stops them. ``pick`` is synchronous and cheap
(checkpoint digests, dict lookups, :func:`filters.plugins.picker.score.choose`); the expensive part,
hashing new text into backend block hashes, runs after the pick in one worker process (a fresh
interpreter spoken to over pipes: :mod:`filters.plugins.picker.worker`), so the filter server's event
loop never waits on it.

Load is the picker's own count of requests in flight per replica (``record`` / ``done``), so two
gateway replicas see only their own share; the KV events they follow are the same, so a prompt
already cached goes to the same replica from either.

A request sent where the same new prefix is being prefilled right now may wait for that
prefill (:mod:`filters.plugins.picker.coalesce`): ``pick_and_lead`` names the lead to follow.

Beside the count, each replica's prefill **backlog**: the prompt tokens the picker sent it that
were not predicted cached, less the tokens its KV events have stored since (a replica stores a
prompt's blocks as its prefill completes, chunk by chunk in SGLang). Events that never come
cannot hold it up: it never exceeds the uncached tokens of the requests still in flight there.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

from chat.tokenizer import HfChatTokenizer
from filters.plugins.picker.coalesce import STORED_SHARE, Lead, Leads, Wait
from filters.plugins.picker.cuts import cut_end, cuts_within
from filters.plugins.picker.latency import LatencyModel, Rates
from filters.plugins.picker.mapper import (
    EMULATOR,
    ROOT,
    CheckpointMap,
    Point,
    adapter_root,
    model_tokenizer,
)
from filters.plugins.picker.mapping_task import run_mapper
from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.prompt import Hold, Prompt, checkpoints, prompt_bytes
from filters.plugins.picker.score import Candidate, Pick, Weights, choose
from filters.plugins.picker.score_ttft import Scoring, choose_ttft
from filters.plugins.picker.worker import MapperWorker
from policy.model import Address, LlmPool
from policy.routing import RoutingPolicy
from prefixindex.index import PrefixIndex
from prefixindex.subscriber import KvEventSubscriber, ReplicaFeed
from runtime.tasks import stop_task

__all__ = ["PoolPicker", "feeds_for"]

_log = logging.getLogger(__name__)
_MAP_GRACE_S = 30.0  # longest a pending pick waits for its prompt to be mapped
_WARM_TIMEOUT_S = 30.0  # longest start() waits for the worker process to come up
_SUFFIX = 64  # a turn's last bytes, which its next turn renders again otherwise (a chat template's
# generation prompt): left out of the comparison
_MATCHED_ENDS = 16_384  # matched prefixes remembered (PoolPicker._shared; ~0.3 KB each, LRU)


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:16]


def feeds_for(
    endpoints: Sequence[Address], routing: RoutingPolicy, backend: str = "sglang"
) -> list[ReplicaFeed]:
    """Each replica's KV-event endpoints: its port + offset (PUB), + the replay offset; the
    events are read as ``backend`` (``pools.NAME.backend``) publishes them."""
    off, replay = routing.kv_events_port_offset, routing.replay_offset
    return [
        ReplicaFeed(
            name=f"{ep.host}:{ep.port}",
            endpoint=f"tcp://{ep.host}:{ep.port + off}",
            replay_endpoint=f"tcp://{ep.host}:{ep.port + replay}",
            backend=backend,
        )
        for ep in endpoints
    ]


class PoolPicker:
    def __init__(
        self,
        pool: str,
        cfg: LlmPool,
        metrics: PickerMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        feeds: Sequence[ReplicaFeed] | None = None,
        queue_size: int = 256,
    ) -> None:
        self.pool = pool
        self.cfg = cfg
        r = cfg.routing
        self.routing = r
        self.weights = Weights(
            r.cache_weight,
            r.max_imbalance,
            r.min_prefix_tokens,
            r.backlog_weight,
            r.sticky_share,
            r.balance_window,
            r.max_share,
        )
        self.scoring = Scoring(r.min_prefix_tokens, r.tpot_budget)
        self.index = PrefixIndex(
            r.page_size,
            max_blocks=r.max_index_blocks,
            stale_after_s=r.index_ttl,
            anchor_every=r.anchor_every,
        )
        self.map = CheckpointMap(r.page_size, r.checkpoint_bytes, anchor_every=r.anchor_every)
        self.feeds = list(feeds if feeds is not None else feeds_for(cfg.endpoints, r, cfg.backend))
        for feed in self.feeds:
            self.index.add_replica(feed.name)
        self.metrics = metrics
        self._clock = clock
        self.clock = clock
        self._wall = self.wall = wall
        self.inflight: dict[str, int] = {f.name: 0 for f in self.feeds}
        # picks per replica over the balance window: each pick adds 1, all decay by 1 - 1/window
        self.recent: dict[str, float] = {f.name: 0.0 for f in self.feeds}
        # prefill backlog per replica (tokens), its bound and the stored-token counter last read
        self.backlog: dict[str, int] = {f.name: 0 for f in self.feeds}
        # each replica's TTFT and decode step, learned (filters/plugins/picker/regret.py)
        self.latency = LatencyModel()
        self._inflight_uncached: dict[str, int] = {f.name: 0 for f in self.feeds}
        self._stored_seen: dict[str, int] = {f.name: 0 for f in self.feeds}
        # checkpoint → {replica: hold}: prefixes recently sent there, before their events
        self._pending: collections.OrderedDict[bytes, dict[str, Hold]] = collections.OrderedDict()
        # (replica, checkpoint) → the request prefilling it there now (prefill coalescing)
        self.leads = Leads(self.map.max_points)
        # the block a mostly cached pick's match ended on → the rest of that prompt (where it
        # starts, its length, its digest): see _shared
        self._matched: collections.OrderedDict[int, tuple[int, int, bytes]] = (
            collections.OrderedDict()
        )
        self.queue: asyncio.Queue[Prompt] | None = None
        self._queue_capacity = queue_size
        self._subscriber: KvEventSubscriber | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.worker: MapperWorker | None = None
        # the model's tokenizer and chat template (routing.tokenizer), loaded by start()
        self.model: HfChatTokenizer | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self, *, worker_process: bool = True) -> None:
        """Load the model's tokenizer if named (``TokenizerFilesError``), start the rest."""
        if self.routing.tokenizer != EMULATOR:  # a 128k-token vocabulary: off the event loop
            self.model = await asyncio.to_thread(model_tokenizer, self.routing.tokenizer)
        self.queue = asyncio.Queue(self._queue_capacity)
        if worker_process:  # a fresh interpreter: never fork one that runs an event loop and ZMQ
            self.worker = MapperWorker(log=_log)
            await self._warm()
        self._subscriber = KvEventSubscriber(
            self.index,
            self.feeds,
            clock=self._clock,
            probe_interval_s=min(1.0, self.routing.index_ttl / 3),
        )
        await self._subscriber.start()
        self._tasks.append(asyncio.create_task(run_mapper(self), name=f"picker-map-{self.pool}"))
        self._tasks.append(asyncio.create_task(self._gauges(), name=f"picker-gauges-{self.pool}"))

    async def _warm(self) -> None:
        """Start the worker process now, with an empty mapping, rather than on the first
        request's: a new interpreter importing the mapper costs ~0.15 s of CPU, which the
        first requests after a start or a reload would otherwise share (and wait behind). A
        failure is logged; the mapper tries again with the first prompt."""
        assert self.worker is not None
        r = self.routing
        try:
            async with asyncio.timeout(_WARM_TIMEOUT_S):
                await self.worker.call(
                    [], r.checkpoint_bytes, r.page_size, r.anchor_every, r.tokenizer
                )
        except Exception as exc:  # logged; the mapping retries on first use
            _log.warning("picker %s: the mapper's worker process did not start: %r", self.pool, exc)

    async def aclose(self) -> None:
        for task in self._tasks:
            await stop_task(task, log=_log)
        self._tasks.clear()
        if self._subscriber is not None:
            await self._subscriber.aclose()
            self._subscriber = None
        if self.worker is not None:
            await self.worker.aclose()
            self.worker = None

    # ---- the request path --------------------------------------------------------------------
    def render(self, kind: str, data: Mapping[str, object]) -> bytes | None:
        """The prompt the backend will see (:func:`~filters.plugins.picker.prompt.prompt_bytes`), with
        the model's own template and special tokens when ``routing.tokenizer`` names one."""
        return prompt_bytes(kind, data, self.model)

    def prompt(self, data: bytes, adapter: str | None = None) -> Prompt:
        """The prompt's checkpoints and known points; for a LoRA ``adapter`` (a name in the
        pool's ``lora.adapters``) both are the adapter's own: its prefix is cached apart from the
        base model's and other adapters' (``prefixindex.adapters``), so it matches only there."""
        root = adapter_root(adapter)
        marks = checkpoints(data, self.routing.checkpoint_bytes, root.digest)
        return Prompt(data, marks, self.map.lookup(marks), root)

    def adapter_of(self, model: str | None) -> str | None:
        """``model`` when it is one of the pool's LoRA adapters, else None (the base model)."""
        lora = self.cfg.lora
        return model if lora is not None and model in lora.adapters else None

    def pick(self, prompt: Prompt, healthy: Callable[[str], bool] | None = None) -> Pick:
        return self.pick_and_lead(prompt, healthy)[0]

    def pick_and_lead(
        self, prompt: Prompt, healthy: Callable[[str], bool] | None = None
    ) -> tuple[Pick, Wait | None]:
        """The pick, and the request prefilling this prompt's prefix on the picked replica right
        now, whose prefill it should wait for (None: none; ``coalesce_wait`` 0: never)."""
        now = self._clock()
        step = self.routing.checkpoint_bytes
        held = self._held(prompt.points, now)
        pending = self._pending_runs(prompt.marks, now)
        leading = self.leads.runs(prompt.marks, now) if self.routing.coalesce_wait > 0 else {}
        self._drain()
        by_ttft = self.routing.scoring == "predicted_ttft"
        # predicted_ttft counts the backlog exactly (no allowance: the rates say what it costs)
        free = 0 if by_ttft else self.routing.backlog_allowance
        # whether a match is shared matters only where it holds sticky_share of the prompt
        # (score.py rule 1), and not at all to predicted_ttft: asked only there
        sticky = math.inf if by_ttft else self.routing.sticky_share * len(prompt.data)
        candidates = []
        for name, count in held.items():
            k = count or 0
            pend = pending.get(name, 0)
            # this prompt's prefix sent there moments ago, its events not in yet, is likely in
            # the replica's backlog: waiting for that prefill is what makes it a cache hit
            own = self._tokens_at(prompt.points, pend) - self._tokens_at(prompt.points, k)
            if pend > len(prompt.points):  # the index cannot know that far yet: trust the pick
                k = max(k, pend)
            lead = leading.get(name)
            if lead is not None and lead.marks > k:
                k = lead.marks  # being prefilled there now: a request sent there waits for it
            matched = cut_end(k, step)
            candidates.append(
                Candidate(
                    name=name,
                    known=count is not None,
                    healthy=healthy(name) if healthy is not None else True,
                    matched_bytes=matched,
                    matched_tokens=self._tokens_at(prompt.points, k),
                    inflight=self.inflight.get(name, 0),
                    cached_blocks=self.index.blocks_of(name),
                    backlog_tokens=max(0, self.backlog.get(name, 0) - max(0, own) - free),
                    recent=self.recent.get(name, 0.0),
                    shared=matched >= sticky and self._shared(prompt, k),
                )
            )
        tie = prompt.marks[0] if prompt.marks else prompt.data[:64]
        if by_ttft:
            pick = choose_ttft(candidates, self._tokens_of(prompt), self.scoring, self._rates, tie)
        else:
            pick = choose(candidates, len(prompt.data), self.weights, tie, self._tokens_of(prompt))
        return pick, self._lead_for(prompt, pick, held, leading)

    def _rates(self, name: str) -> Rates:
        """The replica's learned rates, its decode step with one more request in flight."""
        return self.latency.rates(name, self.inflight.get(name, 0) + 1)

    def _lead_for(
        self, prompt: Prompt, pick: Pick, held: dict[str, int | None], leading: dict[str, Wait]
    ) -> Wait | None:
        """The lead to follow: the picked replica is prefilling this prompt's first
        checkpoints now (``leading``) further than its events show them stored (``held``), by
        at least ``min_prefix_tokens``."""
        wait = leading.get(pick.replica) if pick.replica is not None else None
        if wait is None:
            return None
        stored = held.get(wait.lead.replica) or 0
        if wait.marks <= stored:
            return None
        ahead = self._tokens_at(prompt.points, wait.marks) - self._tokens_at(prompt.points, stored)
        return wait if ahead >= self.routing.min_prefix_tokens else None

    def record(self, prompt: Prompt, pick: Pick) -> int:
        """``pick`` was sent: count it in flight, remember its prefix, map its new text. Returns
        the tokens it adds to the replica's prefill backlog (give them back to ``done``)."""
        return self.record_lead(prompt, pick, lead=False)[0]

    def record_lead(
        self, prompt: Prompt, pick: Pick, *, lead: bool = True
    ) -> tuple[int, Lead | None]:
        """:meth:`record`, and the lead this request is when it has a new prefix to prefill
        (give it to ``done``: requests that follow it stop waiting when it ends; ``lead``
        False: it leads nobody)."""
        name = pick.replica
        if name is None:
            return 0, None
        self.inflight[name] = self.inflight.get(name, 0) + 1
        if self.routing.balance_window > 0:
            keep = 1.0 - 1.0 / self.routing.balance_window
            for other in self.recent:
                self.recent[other] *= keep
            self.recent[name] = self.recent.get(name, 0.0) + 1.0
        self._remember_match(prompt, pick)
        uncached = max(0, self._tokens_of(prompt) - pick.predicted_tokens)
        if name in self.backlog:
            self.backlog[name] += uncached
            self._inflight_uncached[name] += uncached
        queued = False
        if len(prompt.points) < len(prompt.marks) and self.queue is not None:
            try:
                self.queue.put_nowait(prompt)
                queued = True
            except asyncio.QueueFull:
                self.metrics.map_dropped.labels(self.pool).inc()
        if self.routing.pending_ttl > 0:
            # until its text is mapped the index cannot see the prefix at all: the pending pick
            # holds until then (the mapper lags seconds on a busy box), pending_ttl after that
            until = self._clock() + self.routing.pending_ttl + (_MAP_GRACE_S if queued else 0.0)
            hold = Hold(until)
            prompt.holds.append(hold)
            pending = self._pending
            get, touch = pending.get, pending.move_to_end
            for mark in prompt.marks:
                entry = get(mark)
                if entry is None:
                    pending[mark] = {name: hold}  # new: already the most recent
                else:
                    entry[name] = hold
                    touch(mark)
            while len(pending) > self.map.max_points:
                pending.popitem(last=False)
        return uncached, self._lead(prompt, pick, uncached) if lead else None

    def _shared(self, prompt: Prompt, k: int) -> bool:
        """Whether the cached prefix a replica holds of ``prompt`` (its first ``k``
        checkpoints) is one other requests share (a document many ask about) rather than this
        conversation's own history.

        The prefix is named by the backend block its match ends on (the last anchor page of
        its ``k``-th checkpoint: the same for every prompt that shares those tokens, whatever
        follows them). Each request sent mostly cached left, under that block, the rest of its
        prompt from where its text was tokenized up to. If this prompt carries that rest (but
        its last ``_SUFFIX`` bytes: the generation prompt a chat template ends a turn with,
        rendered otherwise by the next turn) and more, it is that conversation's next turn: its
        own history, which a move would prefill again (score.py keeps it on a busy replica).
        Any other rest, or the same prompt again, means the prefix is shared: a second copy on
        another replica pays back. A match the map cannot name yet (past the mapped
        checkpoints) counts as its own."""
        key = self._match_key(prompt, k)
        seen = self._matched.get(key) if key is not None else None
        if seen is None:
            return False  # nobody else matched up to here: its own
        off, rest, digest = seen
        if len(prompt.data) <= off + rest or rest <= _SUFFIX:
            return True
        return _digest(prompt.data[off : off + rest - _SUFFIX]) != digest

    @staticmethod
    def _match_key(prompt: Prompt, k: int) -> int | None:
        """The block a match of ``k`` checkpoints ends on (None: not mapped that far)."""
        if not 0 < k <= len(prompt.points):
            return None
        return prompt.points[k - 1].block

    def _remember_match(self, prompt: Prompt, pick: Pick) -> None:
        """Note the block ``pick``'s cached prefix ends on and the rest of its prompt (only
        for a prompt mostly cached: :meth:`_shared` is asked only about those)."""
        size = len(prompt.data)
        if pick.predicted_bytes <= 0 or pick.predicted_bytes < self.routing.sticky_share * size:
            return
        k = cuts_within(pick.predicted_bytes, self.routing.checkpoint_bytes)
        key = self._match_key(prompt, k)
        if key is None:
            return
        off = prompt.points[k - 1].resume
        matched = self._matched
        matched[key] = (off, size - off, _digest(prompt.data[off : size - _SUFFIX]))
        matched.move_to_end(key)
        while len(matched) > _MATCHED_ENDS:
            matched.popitem(last=False)

    def _lead(self, prompt: Prompt, pick: Pick, uncached: int) -> Lead | None:
        """This request as the lead of its new checkpoints on its replica (None: too little to
        prefill, coalescing off, or its backlog unknown)."""
        r, name = self.routing, pick.replica
        if r.coalesce_wait <= 0 or name is None or uncached < r.min_prefix_tokens:
            return None
        if name not in self.backlog:
            return None
        # its prefill counts as done once the replica's events have stored STORED_SHARE of
        # what was waiting to be prefilled there when it was sent, this request included (the
        # backlog counts from the last count read): see filters/plugins/picker/coalesce.py
        target = self._stored_seen[name] + int(STORED_SHARE * self.backlog[name])
        lead = Lead(name, target, self._clock() + r.coalesce_wait)
        self.leads.add(lead, prompt.marks[cuts_within(pick.predicted_bytes, r.checkpoint_bytes) :])
        return lead

    def indexed(self, prompt: Prompt, name: str, marks: int) -> bool:
        """The index shows ``name`` holding ``prompt``'s first ``marks`` checkpoints (False
        while they are not all mapped yet: then nobody can tell)."""
        points = self.map.lookup(prompt.marks[:marks])
        if len(points) < marks:
            return False
        return (self._held(points, self._clock()).get(name) or 0) >= marks

    def stored_tokens(self, name: str) -> int:
        """Tokens the replica's KV events have stored, ever (what a follower waits on)."""
        return self.index.stored_tokens(name)

    def _tokens_of(self, prompt: Prompt) -> int:
        """The prompt's tokens: mapped exactly as far as its checkpoints are, the rest at the
        bytes per token the map measured."""
        base = prompt.points[-1] if prompt.points else ROOT
        rest = max(0, len(prompt.data) - base.resume)
        return base.tokens + int(rest / self.map.bytes_per_token())

    def _drain(self) -> None:
        """Take the tokens each replica's events stored since the last look off its backlog."""
        for name, seen in self._stored_seen.items():
            stored = self.index.stored_tokens(name)
            if stored != seen:
                self._stored_seen[name] = stored
                self.backlog[name] = max(0, self.backlog[name] - (stored - seen))

    def mapped(self, prompt: Prompt) -> None:
        """``prompt``'s text is mapped: its pending picks expire ``pending_ttl`` from now."""
        until = self._clock() + self.routing.pending_ttl
        for hold in prompt.holds:
            hold.until = min(hold.until, until)

    def _tokens_at(self, points: Sequence[Point], k: int) -> int:
        """Backend tokens (whole pages) covered by the first ``k`` checkpoints. Past the mapped
        ones (a prefix just sent, its text not hashed yet) they are estimated from the bytes per
        token measured by the map, not from a fixed ratio: a wrong ratio over-predicted 1.5x."""
        if k <= 0:
            return 0
        if k <= len(points):
            return points[k - 1].cached_tokens
        base = points[-1] if points else ROOT
        more = (
            cut_end(k, self.routing.checkpoint_bytes) - base.resume
        ) / self.map.bytes_per_token()
        tokens = base.tokens + int(more)
        return tokens - tokens % self.routing.page_size

    def done(self, name: str, uncached: int = 0, lead: Lead | None = None) -> None:
        """A request sent to ``name`` ended; ``uncached`` and ``lead``: what its ``record_lead``
        returned (the requests following its prefill stop waiting)."""
        if lead is not None:
            lead.done = True
        if self.inflight.get(name, 0) > 0:
            self.inflight[name] -= 1
        if name in self._inflight_uncached:
            left = max(0, self._inflight_uncached[name] - uncached)
            self._inflight_uncached[name] = left
            self.backlog[name] = min(self.backlog[name], left)

    def _held(self, points: Sequence[Point], now: float) -> dict[str, int | None]:
        """Per replica: checkpoints held in a row (None = unknown)."""
        index = [i for i, p in enumerate(points) if p.block is not None]
        counts = self.index.query_chain([points[i].block for i in index], now)  # type: ignore[misc]  # index keeps only points whose block is not None; mypy cannot see the filter
        # a run of n blocks ends at checkpoint index[n-1]; leading block-less points are free
        first = index[0] if index else len(points)
        return {
            name: None if c is None else (index[c - 1] + 1 if c else first)
            for name, c in counts.items()
        }

    def _pending_runs(self, marks: Sequence[bytes], now: float) -> dict[str, int]:
        """Per replica recently sent this prefix: how many checkpoints in a row it shares.
        Each replica alive at the first checkpoint walks on alone (two dict reads a step, not a
        set per checkpoint): a prompt's checkpoints run to a few hundred."""
        pending = self._pending
        first = pending.get(marks[0]) if marks else None
        if not first:
            return {}
        get = pending.get
        runs: dict[str, int] = {}
        for name, hold in first.items():
            if hold.until < now:
                continue
            run = 1
            for mark in itertools.islice(marks, 1, None):
                entry = get(mark)
                held = entry.get(name) if entry is not None else None
                if held is None or held.until < now:
                    break
                run += 1
            runs[name] = run
        return runs

    # ---- background --------------------------------------------------------------------------
    async def _gauges(self) -> None:
        while True:
            now, wall = self._clock(), self._wall()
            self.metrics.index_blocks.labels(self.pool).set(len(self.index))
            self._drain()
            for name, tokens in self.backlog.items():
                self.metrics.backlog.labels(self.pool, name).set(tokens)
            maps = self._subscriber.vllm_maps if self._subscriber is not None else {}
            for name, vmap in maps.items():
                self.metrics.vllm_skipped.labels(self.pool, name).set(vmap.skipped_blocks)
            for name in self.index.replicas():
                view = self.index.view(name, now)
                self.metrics.known.labels(self.pool, name).set(1 if view.known else 0)
                if view.last_ts is not None:
                    self.metrics.event_lag.labels(self.pool, name).set(
                        max(0.0, wall - view.last_ts)
                    )
            await asyncio.sleep(1.0)
