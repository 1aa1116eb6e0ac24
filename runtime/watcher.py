"""The policy watcher every process runs: poll, debounce, load and build off the loop, swap.

One implementation for the control plane, the filter server and the rate-limit service:

- it polls the policy file and the files the last good policy names (endpoint files) every
  ``poll_interval`` seconds, and waits until they have been still for ``debounce`` seconds
  (an editor's save or a launcher's rewrite is one reload);
- it builds in a child process when the owner gives :class:`InWorker` (what the three services
  do): ``target(path)`` runs in a long-lived worker process at a lower CPU priority
  (:mod:`runtime.buildworker`), its value comes back in slices unpickled between requests
  (:mod:`runtime.chunked`), and ``finish(value)`` -- the cheap part that needs this process's
  live objects -- runs on the loop. A 10k-tenant build in a thread of the serving process held
  the GIL for seconds and failed requests at Envoy's default timeouts. A worker that dies is
  restarted (counted in ``tokenweir_config_build_worker_restarts_total``) and the build tried
  once more. A plain ``load(path)`` callable still runs in a thread (small owners, tests);
- it hands the result to the owner's ``apply(value)`` on the loop: a cheap, atomic swap, so a
  request sees the old config or the new one, never half of each, and in-flight work finishes
  on what it started with (``apply`` returns False when nothing changed: counted "unchanged");
- any exception while loading, building or applying is caught: the reason is logged once (a
  :class:`~policy.PolicyError` as one ``file:line: key.path: message`` line per
  problem), counted in ``tokenweir_config_reloads_total{result="error"}`` and flagged by
  ``tokenweir_config_last_reload_error`` (back to 0 on the next good load); the last good
  config keeps serving and the next edit is picked up. The watcher itself never dies.

The metric names are the same in every process (:class:`ReloadMetrics`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from runtime.buildworker import BuildWorker, Target, resolve, target_name
from runtime.chunked import Container
from runtime.dispose import WORTH_IT, Retired, dispose
from runtime.errors import BuildFailed, WorkerCrashed, problem_lines
from runtime.gil import SwitchInterval
from runtime.tasks import stop_task

__all__ = ["InWorker", "Loaded", "PolicyWatcher", "ReloadMetrics", "ReloadOutcome"]

T = TypeVar("T")
_LOAD_SWITCH_INTERVAL = 0.0002  # seconds (CPython's default is 0.005)
Fingerprint = tuple[int, int, int] | None


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """What ``load`` returns: the built value and the other files it was built from."""

    value: T
    files: tuple[Path, ...] = ()


@dataclass(frozen=True)
class InWorker(Generic[T]):
    """Build in the worker process: ``target`` (a module-level function ``path -> Loaded[P]``,
    its value picklable, handed in by the service that owns the watcher) runs there; ``finish(P) -> T`` runs on the loop and must be cheap, or be
    a generator that yields between short steps and returns ``T``."""

    target: Target
    # the value comes back unpickled from the worker process: no static type crosses that
    finish: Callable[[Any], T | Generator[None, None, T]]
    nice: int = 10
    timeout: float = 600.0


@dataclass(frozen=True)
class ReloadOutcome:
    ok: bool
    problems: tuple[str, ...] = ()


class ReloadMetrics:
    """``tokenweir_config_*``: the same names in every process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.reloads = Counter(
            "tokenweir_config_reloads",
            "Policy reloads by result (ok, unchanged, error)",
            ["result"],
            registry=registry,
        )
        self.last_ok = Gauge(
            "tokenweir_config_last_reload_success_timestamp_seconds",
            "Unix time of the last policy reload that was applied",
            registry=registry,
        )
        self.last_error = Gauge(
            "tokenweir_config_last_reload_error",
            "1 while the file on disk is rejected (last good config serves)",
            registry=registry,
        )
        self.seconds = Gauge(
            "tokenweir_config_last_reload_seconds",
            "Seconds the last reload spent loading and building (off the event loop)",
            registry=registry,
        )
        self.worker_restarts = Counter(
            "tokenweir_config_build_worker_restarts",
            "Policy build worker processes restarted after one died",
            registry=registry,
        )


def fingerprint(path: Path) -> Fingerprint:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class PolicyWatcher(Generic[T]):
    """Owns one polling task; ``aclose()`` stops it. ``reload()`` may also be called directly."""

    def __init__(
        self,
        path: Path,
        *,
        load: Callable[[Path], Loaded[T]] | InWorker[T],
        apply: Callable[[T], bool | None],
        metrics: ReloadMetrics,
        log: logging.Logger,
        poll_interval: float = 1.0,
        debounce: float = 0.1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path.resolve()
        self._load = load
        self._apply = apply
        self.metrics = metrics
        self._log = log
        self.poll_interval = poll_interval
        self.debounce = debounce
        self._clock = clock
        self._files: tuple[Path, ...] = ()
        self._seen: dict[Path, Fingerprint] = {self.path: fingerprint(self.path)}
        self._task: asyncio.Task[None] | None = None
        self._worker: BuildWorker | None = None
        self._current: Retired | None = None  # the applied value and its large containers
        self._disposing: set[asyncio.Task[None]] = set()
        if isinstance(load, InWorker):
            self._worker = BuildWorker(
                load.target,
                nice=load.nice,
                timeout=load.timeout,
                on_restart=metrics.worker_restarts.inc,
                log=log,
            )

    # -- one reload --------------------------------------------------------------------------
    def reload_now(self) -> ReloadOutcome:
        """Load, build and apply in the calling thread (start-up; tests)."""
        seen = self._fingerprints()
        try:
            loaded = self._timed_load()
        except Exception as exc:  # any failure of load/build: reported, counted, survived
            return self._failed(exc, seen)
        return self._applied(loaded, seen)

    async def reload(self) -> ReloadOutcome:
        """Load and build off the loop (the worker process, or a thread), then apply on it."""
        if self._worker is not None:
            return await self._reload_in_worker(self._worker, self._fingerprints())
        return await self.reload_in_thread()

    async def reload_in_thread(self) -> ReloadOutcome:
        """Load and build in a thread of this process, at its own CPU priority, even where
        reloads go to the worker; then apply on the loop. An owner's first load, with the loop
        running and nothing served yet, belongs here: the worker's lowered priority only
        protects requests, and on a busy host it left a start-up waiting for CPU the rest of
        the host did not leave idle (`tokenweir up` took 50-90 s to publish its first config
        beside a loaded test suite)."""
        seen = self._fingerprints()
        try:
            loaded = await asyncio.to_thread(self._timed_load)
        except Exception as exc:  # any failure of load/build: reported, counted, survived
            return self._failed(exc, seen)
        return self._applied(loaded, seen)

    async def _reload_in_worker(
        self, worker: BuildWorker, seen: dict[Path, Fingerprint]
    ) -> ReloadOutcome:
        assert isinstance(self._load, InWorker)
        start = time.perf_counter()
        quiet = _Quiet()
        try:
            try:
                value, files, parts = await worker.build(self.path, on_first_frame=quiet.enter)
            except WorkerCrashed as exc:  # once more, in a new worker (restarted, counted)
                self._log.error("policy build worker: %s (restarting it)", exc)
                quiet.leave()
                value, files, parts = await worker.build(self.path, on_first_frame=quiet.enter)
            step = self._load.finish(value)
            finished: T = await _drive(step) if isinstance(step, Generator) else step
            self.metrics.seconds.set(time.perf_counter() - start)
            loaded = Loaded(finished, files)
        except Exception as exc:  # any failure of load/build: reported, counted, survived
            quiet.leave()
            return self._failed(exc, seen)
        try:
            return self._applied(loaded, seen, parts)
        finally:
            del loaded, value, parts, finished, step
            quiet.leave()

    def _timed_load(self) -> Loaded[T]:
        # While a large policy is built in this thread the event loop thread must keep the GIL
        # most of the time. Two things take it away for long: the cyclic garbage collector (a
        # 10k-tenant load allocates ~10^6 objects, and each full collection it triggers holds
        # the GIL for seconds on a busy box: ext_proc 504s), and the 5 ms default switch
        # interval (paid at each of the loop's GIL handoffs). A policy builds no cycles worth
        # collecting, so the collector pauses until the build is done; then what exists is
        # frozen (gc.freeze: left out of later collections, still freed by reference counts),
        # or the first full collection after the build would stall the loop instead.
        collecting = gc.isenabled()
        gc.disable()
        switch = SwitchInterval(_LOAD_SWITCH_INTERVAL).__enter__()  # one count for the process
        start = time.perf_counter()
        try:
            if isinstance(self._load, InWorker):  # start-up: built here, in this thread
                built = resolve(target_name(self._load.target))(self.path)
                step = self._load.finish(built.value)
                done: T = _run_through(step) if isinstance(step, Generator) else step
                return Loaded(done, built.files)
            return self._load(self.path)
        finally:
            self.metrics.seconds.set(time.perf_counter() - start)
            switch.__exit__(None, None, None)
            gc.freeze()
            if collecting:
                gc.enable()

    def _applied(
        self, loaded: Loaded[T], seen: dict[Path, Fingerprint], parts: list[Container] | None = None
    ) -> ReloadOutcome:
        try:
            changed = self._apply(loaded.value)
        except Exception as exc:  # an owner's swap failed: the old config is still whole
            return self._failed(exc, seen)
        self._retire(loaded.value, parts or [])
        self._files = tuple(f.resolve() for f in loaded.files)
        self._seen = {**seen, **{f: fingerprint(f) for f in self._files if f not in seen}}
        self.metrics.reloads.labels("unchanged" if changed is False else "ok").inc()
        self.metrics.last_ok.set(self._clock())
        self.metrics.last_error.set(0)
        return ReloadOutcome(True)

    def _retire(self, value: T, parts: list[Container]) -> None:
        """Keep ``value`` (now applied) and its large containers; the value it replaced is
        freed a slice at a time (:func:`runtime.dispose.dispose`)."""
        old = self._current
        self._current = Retired(value, parts)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # reload_now before the loop runs: nothing is serving yet
            return
        if old is not None and sum(len(part) for part in old.parts) >= WORTH_IT:
            task = loop.create_task(dispose(old), name="tokenweir-policy-dispose")
            self._disposing.add(task)
            task.add_done_callback(self._disposing.discard)

    def _failed(self, exc: Exception, seen: dict[Path, Fingerprint]) -> ReloadOutcome:
        self._seen = seen  # this version of the files is judged: wait for the next edit
        self.metrics.reloads.labels("error").inc()
        self.metrics.last_error.set(1)
        # from the worker process already formatted; else a PolicyError's lines, one per issue
        problems = exc.problems if isinstance(exc, BuildFailed) else problem_lines(self.path, exc)
        for line in problems:
            self._log.error("policy rejected, last good config keeps serving: %s", line)
        return ReloadOutcome(False, problems)

    # -- watching ----------------------------------------------------------------------------
    def _watched(self) -> Iterable[Path]:
        return dict.fromkeys((self.path, *self._files))

    def _fingerprints(self) -> dict[Path, Fingerprint]:
        return {f: fingerprint(f) for f in self._watched()}

    def changed(self) -> bool:
        return self._fingerprints() != self._seen

    def start(self) -> None:
        """Begin polling (call after the first load)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"tokenweir-policy-watcher:{self.path.name}"
            )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                if not self.changed():
                    continue
                await self._settle()
                await self.reload()
            except Exception as exc:  # never reached by design; the watcher must not die
                self._log.error("policy watcher: %s: %s (still watching)", type(exc).__name__, exc)

    async def _settle(self) -> None:
        """Wait until the watched files stop changing for ``debounce`` seconds."""
        last = self._fingerprints()
        while True:
            await asyncio.sleep(self.debounce)
            now = self._fingerprints()
            if now == last:
                return
            last = now

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=self._log)  # had it crashed: one line, no traceback
        if self._worker is not None:
            await self._worker.aclose()
        for pending in tuple(self._disposing):
            await stop_task(pending, log=self._log)


def _steps(steps: Generator[None, None, T], out: list[T]) -> Generator[None, None, None]:
    """The yields of ``steps``; its return value is appended to ``out``."""
    out.append((yield from steps))


async def _drive(steps: Generator[None, None, T]) -> T:
    """Run a generator to its return value, letting the loop run at each ``yield``."""
    out: list[T] = []
    for _ in _steps(steps, out):
        await asyncio.sleep(0)
    return out[0]


def _run_through(steps: Generator[None, None, T]) -> T:
    out: list[T] = []
    for _ in _steps(steps, out):
        pass
    return out[0]


class _Quiet:
    """The collector stays off while a built value is assembled, finished and applied (a full
    collection over ~10^5 new objects stalls the loop for tens of ms), then everything alive
    is frozen: kept out of later collections (freed by reference counts as usual). The young
    garbage is collected first, so it is not frozen with the rest."""

    def __init__(self) -> None:
        self._active = False
        self._was_enabled = True

    def enter(self) -> None:
        if self._active:
            return
        self._active = True
        self._was_enabled = gc.isenabled()
        gc.collect(1)  # the young garbage: not frozen with the rest (cheap: young objects only)
        gc.disable()

    def leave(self) -> None:
        if not self._active:
            return
        self._active = False
        gc.freeze()
        if self._was_enabled:
            gc.enable()
