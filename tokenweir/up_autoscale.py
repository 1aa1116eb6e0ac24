"""``tokenweir up`` for autoscaled emulated pools: an :class:`EmulatorFleet` per pool starts
and drains emulator replicas on the online planner's desired count (``--autoscale``; without it
the count stays at ``emulated.replicas``, and the fleet only replaces replicas that die).

The pool's ``endpoints_file`` lists the replicas that serve; the control plane, the filter
servers (admission sizes a pool by it) and the picker follow that file, so:

- **up**: a replica starts on the lowest free port slot (``base_port + i``, up to
  ``max_replicas``) with ``--slow-start load_time`` (model load: ``/health`` answers 503); it is
  written to the file only once ``/health`` answers 200. Until then admission, the ladder and EDS
  see the replicas that exist, not those asked for. A replica that exits or is not ready within
  ``3 × load_time + 30 s`` is stopped, counted in
  ``tokenweir_autoscale_replica_failures_total{pool}``, and its slot rests for 30 s.
- **down**: replicas still loading go first (they hold no stream). A serving replica is taken
  out of the file; once the control plane has published the pool without it (EDS, pool state:
  the picker's index) and one more second has passed for Envoy to apply it, the fleet waits for
  its running and queued requests to reach 0 (two reads in a row), up to ``drain_timeout``, and
  only then stops it: no stream is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter

from controlplane.autoscale import Autoscaler, parse_counters
from controlplane.saturation.errors import ScrapeError
from controlplane.saturation.fetch import HttpFetcher
from policy.autoscale import emulated_slots
from policy.endpoints import format_endpoints
from policy.model import Address, LlmPool
from runtime.children import Child
from runtime.tasks import stop_task

__all__ = ["EmulatorFleet", "FleetMetrics"]

log = logging.getLogger("tokenweir.up")

_TICK_S = 0.25
_FAILED_REST_S = 30.0
_EDS_SETTLE_S = 1.0


class Phase(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"


@dataclass
class _Replica:
    slot: int
    addr: Address
    child: Child
    phase: Phase
    since: float
    unpublished_at: float | None = None  # when the control plane stopped listing it
    idle_reads: int = 0


class FleetMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter(
            "tokenweir_autoscale_replica_failures",
            "Replicas `up` started that exited or were not ready in time", ["pool"],
            registry=registry,
        )  # fmt: skip
        self.changes = Counter(
            "tokenweir_autoscale_replica_changes",
            "Replicas `up` added to (start, ready) or removed from (drain, stop) a pool, and "
            "streams a stop cut (cut: in flight when the drain timeout ended)",
            ["pool", "change"], registry=registry,
        )  # fmt: skip


class EmulatorFleet:
    """One pool's emulator replicas. ``argv(slot, addr)`` builds a replica's command line."""

    def __init__(
        self,
        pool_name: str,
        pool: LlmPool,
        endpoints_file: Path,
        run_dir: Path,
        *,
        argv: Callable[[int, Address], list[str]],
        say: Callable[[str], None] = print,
        clock: Callable[[], float] | None = None,
    ) -> None:
        em, a = pool.emulated, pool.autoscale
        assert em is not None and em.base_port is not None and a is not None  # the loader checks
        self.name = pool_name
        self.file = endpoints_file
        self.run_dir = run_dir
        self.base_port = em.base_port
        self.slots = emulated_slots(em.replicas, a)
        self.policy = a
        self.argv = argv  # the bench appends flags to every replica's command line
        self._desired: Callable[[], int] = lambda: em.replicas
        self._published: Callable[[], frozenset[str]] = frozenset
        self._autoscaler: Autoscaler | None = None
        self._metrics: FleetMetrics | None = None
        self._say = say
        self._clock = clock or asyncio.get_running_loop().time
        self._fetcher = HttpFetcher()
        self.replicas: dict[int, _Replica] = {}
        self._resting: dict[int, float] = {}  # slot → until
        self._task: asyncio.Task[None] | None = None
        self._written: tuple[str, ...] | None = None
        self.cut_streams = 0

    # ---- the file ----------------------------------------------------------------------------
    def serving(self) -> list[Address]:
        return [r.addr for r in sorted(self.replicas.values(), key=lambda r: r.slot)
                if r.phase is Phase.SERVING]  # fmt: skip

    def _write(self) -> None:
        eps = self.serving()
        key = tuple(str(e) for e in eps)
        if key == self._written:
            return
        tmp = self.file.with_name(self.file.name + ".tmp")
        tmp.write_text(
            f"# written by `tokenweir up` (pool {self.name}): the replicas that serve now\n"
            + format_endpoints(eps)
        )
        os.replace(tmp, self.file)
        self._written = key

    # ---- start and stop ----------------------------------------------------------------------
    def _start(self, slot: int) -> None:
        addr = Address("127.0.0.1", self.base_port + slot)
        argv = [*self.argv(slot, addr), "--slow-start", str(self.policy.load_time)]
        name = f"emulator {self.name}#{slot}"
        log_path = self.run_dir / f"emulator-{self.name}-{slot}.log"
        child = Child(name, argv, log_path)  # parent-death signal via setpriv (runtime.children)
        child.start(append=True)
        self.replicas[slot] = _Replica(slot, addr, child, Phase.STARTING, self._clock())
        self._count("start")
        self._say(f"autoscale: {self.name}#{slot} starting on http://{addr} (pid {child.pid})")

    async def _stop(self, rep: _Replica, change: str) -> None:
        self.replicas.pop(rep.slot, None)
        self._count(change)
        await rep.child.aclose(5.0)

    async def start_initial(self, count: int) -> None:
        """``count`` replicas, waited for until they serve (``up`` starts with them)."""
        for slot in range(min(count, self.slots)):
            self._start(slot)
        deadline = self._clock() + self._ready_timeout()
        while any(r.phase is Phase.STARTING for r in self.replicas.values()):
            await self._check_starting()
            if self._clock() > deadline:
                break
            await asyncio.sleep(_TICK_S)
        self._write()

    def _ready_timeout(self) -> float:
        return 3 * self.policy.load_time + 30.0

    # ---- one round ---------------------------------------------------------------------------
    async def step(self) -> None:
        await self._check_starting()
        self._check_serving()
        await self._check_draining()
        await self._reconcile()
        self._write()
        if self._autoscaler is not None:
            starting = [r for r in self.replicas.values() if r.phase is Phase.STARTING]
            now, load = self._clock(), self.policy.load_time
            ready_in = min((r.since + load - now for r in starting), default=None)
            self._autoscaler.set_starting(self.name, len(starting), ready_in)

    async def _check_starting(self) -> None:
        now = self._clock()
        for rep in [r for r in self.replicas.values() if r.phase is Phase.STARTING]:
            if not rep.child.alive():
                self._fail(rep, f"exited with {rep.child.returncode}:\n{rep.child.log_tail(5)}")
                continue
            if now - rep.since > self._ready_timeout():
                await rep.child.aclose(1.0)
                self._fail(rep, f"not ready within {self._ready_timeout():g}s")
                continue
            with contextlib.suppress(ScrapeError):
                await self._fetcher.metrics(str(rep.addr), 0.5, "/health")
                rep.phase, rep.since = Phase.SERVING, now
                self._count("ready")
                self._say(f"autoscale: {self.name}#{rep.slot} ready after loading")

    def _fail(self, rep: _Replica, why: str) -> None:
        self.replicas.pop(rep.slot, None)
        self._resting[rep.slot] = self._clock() + _FAILED_REST_S
        if self._metrics is not None:
            self._metrics.failures.labels(self.name).inc()
        log.error("autoscale: %s#%d failed to start: %s", self.name, rep.slot, why)
        self._say(f"autoscale: {self.name}#{rep.slot} failed to start ({why.splitlines()[0]})")

    def _check_serving(self) -> None:
        for rep in [r for r in self.replicas.values() if r.phase is Phase.SERVING]:
            if not rep.child.alive():  # died: out of the file; the reconcile starts another
                self.replicas.pop(rep.slot, None)
                self._say(f"autoscale: {self.name}#{rep.slot} exited ({rep.child.returncode})")

    async def _check_draining(self) -> None:
        now = self._clock()
        listed = self._published()
        for rep in [r for r in self.replicas.values() if r.phase is Phase.DRAINING]:
            if str(rep.addr) in listed:
                continue  # the control plane still serves it: wait for the reload
            if rep.unpublished_at is None:
                rep.unpublished_at = now
            if now - rep.unpublished_at < _EDS_SETTLE_S:
                continue
            inflight = await self._inflight(rep)
            rep.idle_reads = rep.idle_reads + 1 if inflight == 0 else 0
            if rep.idle_reads >= 2:
                await self._stop(rep, "stop")
                self._say(f"autoscale: {self.name}#{rep.slot} drained and stopped")
            elif now - rep.since > self.policy.drain_timeout:
                cut = int(inflight or 0)
                self.cut_streams += cut
                if cut and self._metrics is not None:
                    self._metrics.changes.labels(self.name, "cut").inc(cut)
                log.warning("autoscale: %s#%d drain timeout, %d cut", self.name, rep.slot, cut)
                await self._stop(rep, "stop")

    async def _inflight(self, rep: _Replica) -> float | None:
        try:
            counters = parse_counters(await self._fetcher.metrics(str(rep.addr), 0.5))
        except ScrapeError:
            return None if rep.child.alive() else 0.0
        return None if counters is None else counters.inflight

    async def _reconcile(self) -> None:
        want = max(0, min(self._desired(), self.slots))
        live = [r for r in self.replicas.values() if r.phase is not Phase.DRAINING]
        now = self._clock()
        if want > len(live):
            free = [
                s for s in range(self.slots)
                if s not in self.replicas and self._resting.get(s, 0.0) <= now
            ]  # fmt: skip
            for slot in free[: want - len(live)]:
                self._start(slot)
        elif want < len(live):
            extra = len(live) - want
            starting = sorted(
                (r for r in live if r.phase is Phase.STARTING), key=lambda r: -r.since
            )
            for rep in starting[:extra]:  # holds no stream: stopped at once
                self.replicas.pop(rep.slot, None)
                await rep.child.aclose(1.0)
                self._count("stop")
                self._say(f"autoscale: {self.name}#{rep.slot} no longer needed while loading")
                extra -= 1
            serving = sorted((r for r in live if r.phase is Phase.SERVING), key=lambda r: -r.slot)
            for rep in serving[:extra]:
                rep.phase, rep.since = Phase.DRAINING, now
                self._count("drain")
                self._say(f"autoscale: {self.name}#{rep.slot} draining (out of EDS first)")

    def _count(self, change: str) -> None:
        if self._metrics is not None:
            self._metrics.changes.labels(self.name, change).inc()

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(
        self,
        *,
        desired: Callable[[], int] | None = None,
        published: Callable[[], frozenset[str]] | None = None,
        autoscaler: Autoscaler | None = None,
        metrics: FleetMetrics | None = None,
    ) -> None:
        """Converge on ``desired()`` from now on (None: keep ``emulated.replicas``), confirming
        drains against ``published()`` (the endpoints the control plane serves the pool with)."""
        self._desired = desired or self._desired
        self._published = published or self._published
        self._autoscaler = autoscaler or self._autoscaler
        self._metrics = metrics or self._metrics
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"tokenweir-fleet-{self.name}")

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # one bad round must not stop the fleet; logged, next round
                log.exception("autoscale fleet %s: round failed", self.name)
            await asyncio.sleep(_TICK_S)

    async def aclose(self) -> None:
        """Stop the loop, then every replica (``up`` has drained the Envoys by then)."""
        task, self._task = self._task, None
        await stop_task(task, log=log)
        await asyncio.gather(*(r.child.aclose(5.0) for r in self.replicas.values()))
        self.replicas.clear()
        await self._fetcher.aclose()
