"""The control plane's scrape loop: every pool replica's ``/metrics``, concurrently, each
``interval``; the result is one versioned :class:`PoolState` (the only pool-state channel).

The version grows only when something a reader acts on changed (saturation, counts, flags;
not the ages), so long-polling readers wake on change. Capacity is the policy's, completed
once per replica from ``/get_server_info``, with how the replica orders its queue (SGLang's
priority-scheduling arguments, published per replica as ``rank``); read again when a replica
answers after it did not (it may have restarted with other flags). A replica that does not
answer keeps its last good sample until ``stale_after``; then it is published stale and
saturated. A replica whose host name does not resolve is left out of the pool until it does
(:class:`NameNotFound`): in Kubernetes the policy lists a StatefulSet's pod names up to the
autoscaler's maximum, and a headless Service with ``publishNotReadyAddresses: false`` names only
the ready pods, so a pod not started or still loading is capacity that does not exist yet, not a
saturated replica (Envoy's STRICT_DNS cluster leaves it out the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, Counter, Gauge

from backends.sglang.capacity import parse_server_info
from controlplane.saturation.errors import NameNotFound, ScrapeError
from controlplane.saturation.fetch import Fetcher
from controlplane.saturation.targets import PoolTargets, ScrapeSettings
from poolstate import (
    Capacity,
    MetricsTextError,
    PoolState,
    Ranking,
    ReplicaSample,
    ReplicaState,
    parse_backend_metrics,
    replica_mismatch,
    replica_state,
    summarize_pool,
)
from runtime.tasks import stop_task

__all__ = ["PoolScraper"]

log = logging.getLogger("tokenweir.saturation")
_INFO_RETRY_S = 10.0
# what a published state was built from: every pool's replica states (ages zeroed) and its
# replicas starting (count, ready at); an equal one publishes nothing new
_Signature = tuple[dict[str, dict[str, ReplicaState]], dict[str, tuple[int, float | None]]]


@dataclass(slots=True)
class _Replica:
    sample: ReplicaSample | None = None
    sample_at: float = 0.0
    answered: bool = False
    info: Capacity | None = None
    info_next_try: float = 0.0
    ranking: Ranking = field(default_factory=Ranking)
    reread: bool = False  # read the server info again once it answers (it may have restarted)
    backend: str = "sglang"  # its pool's backend kind: the metric names read, server info or not
    absent: bool = False  # its name did not resolve at the last scrape: left out of the pool


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.scrapes = Counter(
            "tokenweir_pool_scrapes", "Replica /metrics scrapes by result", ["result"],
            registry=registry,
        )  # fmt: skip
        self.pool = Gauge(
            "tokenweir_pool_saturation", "Mean replica saturation per pool", ["pool"],
            registry=registry,
        )  # fmt: skip
        self.replica = Gauge(
            "tokenweir_replica_saturation", "Replica saturation (2 = queue full or stale)",
            ["pool", "endpoint"], registry=registry,
        )  # fmt: skip
        self.version = Gauge(
            "tokenweir_pool_state_version", "Version of the published pool state",
            registry=registry,
        )  # fmt: skip
        labels = ["pool", "endpoint"]
        self.running = Gauge(
            "tokenweir_replica_running", "Requests running on a replica (its last scrape)",
            labels, registry=registry,
        )  # fmt: skip
        self.queued = Gauge(
            "tokenweir_replica_queued", "Requests waiting on a replica (its last scrape)",
            labels, registry=registry,
        )  # fmt: skip
        self.cache_hit = Gauge(
            "tokenweir_replica_cache_hit_ratio", "Prefix-cache hit rate a replica reports, 0..1",
            labels, registry=registry,
        )  # fmt: skip
        self.kv_usage = Gauge(
            "tokenweir_replica_kv_usage", "KV-cache usage a replica reports, 0..1",
            labels, registry=registry,
        )  # fmt: skip
        self.up = Gauge(
            "tokenweir_replica_up", "1 while a replica's last /metrics scrape answered and is fresh",
            labels, registry=registry,
        )  # fmt: skip
        self.degraded = Gauge(
            "tokenweir_replica_degraded", "1 while a replica is marked saturated (EDS weight down)",
            labels, registry=registry,
        )  # fmt: skip
        self.pool_queued = Gauge(
            "tokenweir_pool_queued", "Requests waiting on a pool's fresh replicas", ["pool"],
            registry=registry,
        )  # fmt: skip
        self.pool_cache_hit = Gauge(
            "tokenweir_pool_cache_hit_ratio", "Mean prefix-cache hit rate of a pool's fresh replicas",
            ["pool"], registry=registry,
        )  # fmt: skip
        self.ranked = Gauge(
            "tokenweir_replica_ranked",
            "Pools with priority_scheduling: 1 the replica schedules by priority as declared, "
            "0 it differs, -1 it does not say", labels, registry=registry,
        )  # fmt: skip


class PoolScraper:
    """Owns the scrape task; ``aclose`` stops it and closes the fetcher."""

    def __init__(
        self,
        fetcher: Fetcher,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        registry: CollectorRegistry | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._fetcher = fetcher
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._metrics = _Metrics(registry) if registry is not None else None
        self.settings = ScrapeSettings()
        self.targets: dict[str, PoolTargets] = {}
        self._replicas: dict[str, _Replica] = {}
        self.state = PoolState()
        self._signature: _Signature | None = None
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[PoolState], None]] = []
        self._taps: list[Callable[[str, str], None]] = []  # (endpoint, /metrics text)
        self._task: asyncio.Task[None] | None = None
        self._mismatch: dict[tuple[str, str], str | None] = {}  # (pool, endpoint) → last logged
        self._starting: dict[str, tuple[int, float | None]] = {}  # pool → (count, ready_at)

    # ---- configuration ----------------------------------------------------------------------
    def configure(self, settings: ScrapeSettings, targets: dict[str, PoolTargets]) -> None:
        """New policy: replicas no pool names any more are forgotten."""
        self.settings, self.targets = settings, dict(targets)
        wanted = {ep for t in targets.values() for ep in t.endpoints}
        self._replicas = {ep: self._replicas.get(ep, _Replica()) for ep in sorted(wanted)}
        for t in targets.values():
            for ep in t.endpoints:
                self._replicas[ep].backend = t.backend

    def tap(self, reader: Callable[[str, str], None]) -> None:
        """Called with every replica page read (the online planner reads its counters)."""
        self._taps.append(reader)

    def subscribe(self, listener: Callable[[PoolState], None]) -> None:
        """Called with every newly published state (the EDS publisher is one)."""
        self._listeners.append(listener)

    def set_starting(self, pool: str, count: int, ready_in_s: float | None) -> None:
        """Replicas of ``pool`` started and not serving yet, the first expected to serve in
        ``ready_in_s`` (None: unknown); published with the next state (whole seconds of the
        wall clock, so a steady estimate does not bump the version every round)."""
        ready_at = None
        if count > 0 and ready_in_s is not None and ready_in_s > 0:
            ready_at = float(math.ceil(self._wall() + ready_in_s))
        self._starting[pool] = (count, ready_at) if count > 0 else (0, None)

    # ---- one round ---------------------------------------------------------------------------
    async def scrape_once(self) -> PoolState:
        """Read every replica concurrently, then publish if anything changed."""
        started = self._wall()  # the state's ts: when the round began (readers measure from it)
        eps = list(self._replicas)
        await asyncio.gather(*(self._scrape(ep, self._replicas[ep]) for ep in eps))
        return self._publish(self._build(), started)

    async def _scrape(self, ep: str, rep: _Replica) -> None:
        now = self._clock()
        timeout = self.settings.timeout_s
        info = rep.backend != "vllm"  # vLLM has no server-info endpoint: the policy's capacity
        if info and rep.info is None and now >= rep.info_next_try:
            await self._read_info(ep, rep, now)
        try:
            text = await self._fetcher.metrics(ep, timeout)
            sample = parse_backend_metrics(text, rep.backend)
            for reader in self._taps:
                reader(ep, text)
        except NameNotFound as exc:
            rep.absent, rep.answered, rep.sample = True, False, None
            rep.reread = rep.info is not None
            self._count("absent")
            log.debug("no such replica now: %s", exc)
            return
        except (ScrapeError, MetricsTextError) as exc:
            rep.answered = False
            rep.reread = rep.info is not None
            self._count("error")
            log.debug("scrape failed: %s", exc)
            return
        if (
            rep.reread and info
        ):  # back after a failure: the server may have restarted with other flags
            rep.reread = False
            await self._read_info(ep, rep, now)
        rep.answered, rep.absent = sample.complete, False
        self._count("ok" if sample.complete else "incomplete")
        if sample.complete:
            rep.sample, rep.sample_at = sample, self._clock()

    async def _read_info(self, ep: str, rep: _Replica, now: float) -> None:
        rep.info_next_try = now + _INFO_RETRY_S
        try:
            hints = parse_server_info(await self._fetcher.server_info(ep, self.settings.timeout_s))
        except ScrapeError as exc:  # a re-read that fails keeps what the last one said
            log.debug("no server info yet: %s", exc)
            return
        rep.info = Capacity(
            hints.max_running_requests, hints.max_queued_requests, hints.max_total_tokens
        )
        rep.ranking = hints.ranking

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.scrapes.labels(result).inc()

    def _build(self) -> dict[str, dict[str, ReplicaState]]:
        now = self._clock()
        out: dict[str, dict[str, ReplicaState]] = {}
        for pool, t in self.targets.items():
            prev = self.state.pools.get(pool)
            reps: dict[str, ReplicaState] = {}
            for ep in t.endpoints:
                rep = self._replicas[ep]
                if rep.absent:
                    continue
                was = prev.endpoints[ep].degraded if prev and ep in prev.endpoints else False
                rs = replica_state(
                    rep.sample,
                    self._capacity(t, rep),
                    age_s=now - rep.sample_at if rep.sample is not None else 0.0,
                    stale_after_s=self.settings.stale_after_s,
                    answered=rep.answered,
                )
                deg = t.hysteresis.next(was, rs.saturation) if t.hysteresis else False
                reps[ep] = replace(rs, degraded=deg, ranking=rep.ranking)
            out[pool] = reps
        return out

    @staticmethod
    def _capacity(t: PoolTargets, rep: _Replica) -> Capacity:
        return t.capacity.merged(rep.info) if rep.info is not None else t.capacity

    def _publish(self, pools: dict[str, dict[str, ReplicaState]], ts: float) -> PoolState:
        starting = {p: self._starting.get(p, (0, None)) for p in pools}
        sig = (
            {p: {ep: replace(r, age_s=0.0) for ep, r in reps.items()} for p, reps in pools.items()},
            starting,
        )
        if sig == self._signature:
            return self.state
        self._signature = sig
        summaries = {
            p: replace(
                summarize_pool(
                    reps, {ep: self._capacity(self.targets[p], self._replicas[ep]) for ep in reps}
                ),
                starting=starting[p][0],
                ready_at=starting[p][1],
            )
            for p, reps in pools.items()
        }
        self.state = PoolState(self.state.version + 1, ts, summaries)
        self._changed.set()
        self._changed = asyncio.Event()
        self._export()
        self._check_ranking()
        for listener in self._listeners:
            listener(self.state)
        return self.state

    def _export(self) -> None:
        if self._metrics is None:
            return
        self._metrics.version.set(self.state.version)
        m = self._metrics
        for pool, summary in self.state.pools.items():
            m.pool.labels(pool).set(summary.saturation)
            fresh = summary.fresh
            m.pool_queued.labels(pool).set(sum(r.queued for r in fresh))
            hit = sum(r.cache_hit_rate for r in fresh) / len(fresh) if fresh else 0.0
            m.pool_cache_hit.labels(pool).set(hit)
            for ep, r in summary.endpoints.items():
                m.replica.labels(pool, ep).set(r.saturation)
                m.running.labels(pool, ep).set(r.running)
                m.queued.labels(pool, ep).set(r.queued)
                m.cache_hit.labels(pool, ep).set(r.cache_hit_rate)
                m.kv_usage.labels(pool, ep).set(r.token_usage)
                m.up.labels(pool, ep).set(1 if r.healthy and not r.stale else 0)
                m.degraded.labels(pool, ep).set(1 if r.degraded else 0)
            for ep in set(self.targets[pool].endpoints) - set(summary.endpoints):  # absent
                m.up.labels(pool, ep).set(0)

    def _check_ranking(self) -> None:
        """Per replica of a pool that declares priority scheduling: whether it schedules as
        declared (gauge), and a warning each time what differs changes."""
        seen: dict[tuple[str, str], str | None] = {}
        for pool, summary in self.state.pools.items():
            want = self.targets[pool].priority if pool in self.targets else None
            if want is None:
                continue
            for ep, r in summary.endpoints.items():
                why = replica_mismatch(r.ranking, want)
                if self._metrics is not None:
                    value = -1 if not r.ranking.known else 0 if why else 1
                    self._metrics.ranked.labels(pool, ep).set(value)
                seen[(pool, ep)] = why
                if why is not None and self._mismatch.get((pool, ep)) != why:
                    log.warning(
                        "pool %s replica %s %s, but pools.%s.priority_scheduling is enabled: "
                        "admission stops admitting interactive past batch for the pool",
                        pool, ep, why, pool,
                    )  # fmt: skip
        self._mismatch = seen

    # ---- readers -----------------------------------------------------------------------------
    async def wait_newer(self, after_version: int, timeout_s: float) -> PoolState:
        """The state as soon as its version exceeds ``after_version``, or the current one after
        ``timeout_s``."""
        if self.state.version > after_version:
            return self.state
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.state.version <= after_version:
                    await self._changed.wait()
        return self.state

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tokenweir-pool-scraper")

    async def _run(self) -> None:
        while True:
            started = self._clock()
            try:
                await self.scrape_once()
            except Exception:  # a bug in one round must not end the signal; logged, next round
                log.exception("pool scrape round failed")
            spent = self._clock() - started
            await self._sleep(max(self.settings.interval_s - spent, 0.0))

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)
        await self._fetcher.aclose()
