"""The routers of bench/routing_sim.py: each names a replica for a job (the real picker, ring
hash with bounded load, sglang-router's ``cache_aware`` as documented)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import zlib
from collections.abc import Sequence

from filters.plugins.picker.coalesce import Lead, Wait, follow
from filters.plugins.picker.cuts import cut_end
from filters.plugins.picker.pool import PoolPicker
from filters.plugins.picker.prompt import Prompt, checkpoints

__all__ = ["ApproxTreeRouter", "Job", "PickerRouter", "RingHashRouter", "Router", "probe"]


@dataclasses.dataclass
class Job:
    data: bytes  # the rendered prompt, as the picker renders it
    ids: tuple[int, ...]
    max_tokens: int


class Router:
    """Names a replica for a job; told when the job is done."""

    def pick(self, job: Job, inflight: Sequence[int]) -> tuple[int, int]:
        """(replica index, predicted cached tokens)."""
        raise NotImplementedError

    def done(self, replica: int, job: Job) -> None:
        return None

    async def hold(self, job: Job) -> None:
        """Before the job is sent: wait for whatever the router waits for (nothing)."""
        return None


class PickerRouter(Router):
    """The real picker; its checkpoint map is filled ``map_delay`` s after each pick (the
    mapper's worker process lags on a busy machine)."""

    def __init__(self, picker: PoolPicker, names: list[str], map_delay: float) -> None:
        self.picker, self.names, self.map_delay = picker, names, map_delay
        self.sent: dict[int, tuple[int, Lead | None]] = {}  # id(job) → what record_lead said
        self.work: dict[int, tuple[int, int]] = {}  # id(job) → (backlog, batch) when sent
        self.follow: dict[int, tuple[str, Prompt, Wait]] = {}  # id(job) → the prefill it awaits
        self.coalesced: collections.Counter[str] = collections.Counter()
        self.waited = 0.0

    def pick(self, job: Job, inflight: Sequence[int]) -> tuple[int, int]:
        prompt = self.picker.prompt(job.data)
        probe(self.picker)
        pick, wait = self.picker.pick_and_lead(prompt)
        assert pick.replica is not None, pick
        self.sent[id(job)] = self.picker.record_lead(prompt, pick)
        name = pick.replica
        self.work[id(job)] = (self.picker.backlog.get(name, 0), self.picker.inflight.get(name, 1))
        if wait is not None:
            self.follow[id(job)] = (pick.replica, prompt, wait)

        def extend() -> None:
            known = len(self.picker.map.lookup(prompt.marks))
            self.picker.map.extend(prompt.data, prompt.marks, known, len(prompt.marks))

        if self.map_delay > 0:
            asyncio.get_running_loop().call_later(self.map_delay, extend)
        else:
            extend()
        return self.names.index(pick.replica), pick.predicted_tokens

    def done(self, replica: int, job: Job) -> None:
        uncached, own = self.sent.pop(id(job), (0, None))
        self.picker.done(self.names[replica], uncached, own)

    def learn(self, replica: int, job: Job, ttft: float | None, step: float | None) -> None:
        """What the request saw teaches the picker's latency model (as the regret observer
        does on the real path: filters/plugins/picker/regret.py)."""
        work, running = self.work.pop(id(job), (0, 1))
        name = self.names[replica]
        if ttft is not None:
            self.picker.latency.observe(name, work, ttft)
        if step is not None:
            self.picker.latency.observe_step(name, running, step)

    async def hold(self, job: Job) -> None:
        entry = self.follow.pop(id(job), None)
        if entry is None:
            return
        name, prompt, wait = entry
        p, clock = self.picker, self.picker.clock
        t0 = clock()
        outcome = await follow(
            wait.lead, lambda: p.stored_tokens(name), clock,
            indexed=lambda: p.indexed(prompt, name, wait.marks),
        )  # fmt: skip
        self.coalesced[outcome] += 1
        self.waited += clock() - t0


class RingHashRouter(Router):
    """Rendezvous hash of the first 256 tokens; a replica above 1.5x the mean load is skipped."""

    def __init__(self, n: int, factor: float = 1.5) -> None:
        self.n, self.factor = n, factor

    def pick(self, job: Job, inflight: Sequence[int]) -> tuple[int, int]:
        key = b"".join(t.to_bytes(4, "little") for t in job.ids[:256])
        order = sorted(range(self.n), key=lambda i: -zlib.crc32(key, zlib.crc32(bytes([i]))))
        bound = self.factor * (sum(inflight) + 1) / self.n
        return next((i for i in order if inflight[i] + 1 <= bound), order[0]), 0


class ApproxTreeRouter(Router):
    """Per worker an LRU of prompt checkpoints (512 bytes) filled at routing time."""

    def __init__(self, n: int, max_bytes: int, threshold: float = 0.3) -> None:
        self.trees: list[collections.OrderedDict[bytes, None]] = [
            collections.OrderedDict() for _ in range(n)
        ]
        self.max_marks, self.threshold = max(1, max_bytes // 512), threshold

    def pick(self, job: Job, inflight: Sequence[int]) -> tuple[int, int]:
        marks = checkpoints(job.data, 512)
        runs = []
        for tree in self.trees:
            k = 0
            while k < len(marks) and marks[k] in tree:
                k += 1
            runs.append(k)
        best = max(range(len(self.trees)), key=lambda i: runs[i])
        ratio = cut_end(runs[best], 512) / max(len(job.data), 1)
        if ratio <= self.threshold:
            best = min(range(len(self.trees)), key=lambda i: len(self.trees[i]))
        tree = self.trees[best]
        for mark in marks:
            tree[mark] = None
            tree.move_to_end(mark)
        while len(tree) > self.max_marks:
            tree.popitem(last=False)
        return best, 0


def probe(picker: PoolPicker) -> None:
    """What the subscriber's replay probes do (every <= 1 s): every replica was heard now."""
    now = picker._clock()
    for name in picker.index.replicas():
        picker.index.heard(name, now)
