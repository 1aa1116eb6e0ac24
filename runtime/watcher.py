"""The policy watcher every process runs: poll, debounce, load and build off the loop, swap.

One implementation for the control plane, the filter server and the rate-limit service:

- it polls the policy file and the files the last good policy names (endpoint files) every
  ``poll_interval`` seconds, and waits until they have been still for ``debounce`` seconds
  (an editor's save or a launcher's rewrite is one reload);
- it runs the owner's ``load(path)`` in a worker thread: parsing and building (10k tenants,
  plugin chains, Envoy resources) never block the event loop that serves requests;
- it hands the result to the owner's ``apply(value)`` on the loop: a cheap, atomic swap, so a
  request sees the old config or the new one, never half of each, and in-flight work finishes
  on what it started with (``apply`` returns False when nothing changed: counted "unchanged");
- any exception while loading, building or applying is caught: the reason is logged once (a
  :class:`~controlplane.policy.PolicyError` as one ``file:line: key.path: message`` line per
  problem), counted in ``tokenweir_config_reloads_total{result="error"}`` and flagged by
  ``tokenweir_config_last_reload_error`` (back to 0 on the next good load); the last good
  config keeps serving and the next edit is picked up. The watcher itself never dies.

The metric names are the same in every process (:class:`ReloadMetrics`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from controlplane.policy import PolicyError
from runtime.tasks import stop_task

__all__ = ["Loaded", "PolicyWatcher", "ReloadMetrics", "ReloadOutcome"]

T = TypeVar("T")
_LOAD_SWITCH_INTERVAL = 0.0002  # seconds (CPython's default is 0.005)
Fingerprint = tuple[int, int, int] | None


@dataclass(frozen=True)
class Loaded(Generic[T]):
    """What ``load`` returns: the built value and the other files it was built from."""

    value: T
    files: tuple[Path, ...] = ()


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
        load: Callable[[Path], Loaded[T]],
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
        """Load and build in a worker thread, then apply on the loop."""
        seen = self._fingerprints()
        try:
            loaded = await asyncio.to_thread(self._timed_load)
        except Exception as exc:  # any failure of load/build: reported, counted, survived
            return self._failed(exc, seen)
        return self._applied(loaded, seen)

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
        previous = sys.getswitchinterval()
        gc.disable()
        sys.setswitchinterval(min(previous, _LOAD_SWITCH_INTERVAL))
        start = time.perf_counter()
        try:
            return self._load(self.path)
        finally:
            self.metrics.seconds.set(time.perf_counter() - start)
            sys.setswitchinterval(previous)
            gc.freeze()
            if collecting:
                gc.enable()

    def _applied(self, loaded: Loaded[T], seen: dict[Path, Fingerprint]) -> ReloadOutcome:
        try:
            changed = self._apply(loaded.value)
        except Exception as exc:  # an owner's swap failed: the old config is still whole
            return self._failed(exc, seen)
        self._files = tuple(f.resolve() for f in loaded.files)
        self._seen = {**seen, **{f: fingerprint(f) for f in self._files if f not in seen}}
        self.metrics.reloads.labels("unchanged" if changed is False else "ok").inc()
        self.metrics.last_ok.set(self._clock())
        self.metrics.last_error.set(0)
        return ReloadOutcome(True)

    def _failed(self, exc: Exception, seen: dict[Path, Fingerprint]) -> ReloadOutcome:
        self._seen = seen  # this version of the files is judged: wait for the next edit
        self.metrics.reloads.labels("error").inc()
        self.metrics.last_error.set(1)
        if isinstance(exc, PolicyError):
            problems = tuple(str(i) for i in exc.issues)
        else:
            problems = (f"{self.path}: {type(exc).__name__}: {exc}",)
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
