"""The life of a long-running process: start, serve until a signal, drain, stop, no traceback.

:func:`serve` is the one main loop of ``python -m filters``, ``python -m ratelimit_service`` and
``tokenweir serve``. The first SIGTERM or SIGINT (Ctrl-C) starts the drain: workers of the
supervisor get SIGTERM, the service reports NOT_SERVING on ``grpc.health.v1.Health`` and stops
taking new work, and work in flight gets up to ``drain_timeout`` seconds to finish. A second
signal cuts the drain short, and the close after it too: a close still running
``CLOSE_GRACE`` seconds after the second signal (or past its own limit, the drain timeout plus
that grace) is cancelled, and a close that will not even be cancelled ends the process. Whatever
fails while stopping is logged as one line; the exit status says it (0: clean, 1: something
failed while stopping).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from typing import NoReturn, Protocol

from runtime.supervisor import WorkerSupervisor

__all__ = ["CLOSE_GRACE", "Drainable", "Signals", "freeze_startup_heap", "run", "serve"]

log = logging.getLogger(__name__)

CLOSE_GRACE = 5.0  # seconds a close may still take after a second signal


class Drainable(Protocol):
    async def start(self) -> object: ...

    async def drain(self, timeout: float) -> None:
        """Report NOT_SERVING, refuse new work, wait for work in flight (up to ``timeout``)."""

    async def aclose(self) -> None: ...


class Signals:
    """Counts SIGTERM/SIGINT: ``first`` is set by the first, ``second`` by the next one."""

    def __init__(self, sigs: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.first = asyncio.Event()
        self.second = asyncio.Event()
        self._sigs = sigs
        loop = asyncio.get_running_loop()
        for sig in sigs:
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: signal.Signals) -> None:
        if self.first.is_set():
            log.warning("%s again: stopping without waiting for work in flight", sig.name)
            self.second.set()
        else:
            log.info("%s: draining", sig.name)
            self.first.set()

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._sigs:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive into the collector's permanent generation
    (``gc.freeze``): what start-up built (modules, the policy, the routes, the clients) lives as
    long as the process, and each full collection would walk it again. A filter server under
    load measured full collections of **27–58 ms** that stopped every request (docs/benchmarks.md,
    "Full collections"). Frozen objects are still freed by reference counting. Returns how many
    objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


async def serve(
    service: Drainable,
    *,
    drain_timeout: float,
    workers: WorkerSupervisor | None = None,
    ready: Callable[[], str] | None = None,
    hard_exit: Callable[[int], NoReturn] = os._exit,
) -> int:
    """Run ``service`` until a signal, then drain and stop it (and the workers). Exit status.
    ``hard_exit`` ends the process when a close cut short refuses to be cancelled."""
    signals = Signals()
    try:
        await service.start()
        if workers is not None:
            workers.start()
        frozen = freeze_startup_heap()
        log.debug("start-up heap frozen: %d objects left out of later collections", frozen)
        if ready is not None:
            print(ready(), flush=True)
        await signals.first.wait()
        return await _stop(service, signals, drain_timeout, workers, hard_exit)
    finally:
        signals.close()


async def _close(
    service: Drainable, signals: Signals, timeout: float, hard_exit: Callable[[int], NoReturn]
) -> int:
    """``service.aclose()``, bounded: by the drain timeout plus ``CLOSE_GRACE``, and by
    ``CLOSE_GRACE`` after a second signal. Exit status (1: it failed or was cut short)."""
    close = asyncio.create_task(service.aclose(), name="aclose")
    cut = asyncio.create_task(signals.second.wait(), name="second-signal")
    try:
        await asyncio.wait(
            {close, cut}, timeout=timeout + CLOSE_GRACE, return_when=asyncio.FIRST_COMPLETED
        )
        if not close.done():
            await asyncio.wait({close}, timeout=CLOSE_GRACE)
    finally:
        cut.cancel()
    if close.done():
        exc = close.exception() if not close.cancelled() else None
        if exc is None:
            return 0
        log.error("stopping failed: %s: %s", type(exc).__name__, str(exc)[:300])
        return 1
    close.cancel()
    await asyncio.wait({close}, timeout=1.0)
    if not close.done():  # it swallows its cancellation: nothing else will stop it
        log.error("stopping cut short: the close did not end, even cancelled; exiting")
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        hard_exit(1)
    log.error("stopping cut short: the close was still running; cancelled")
    return 1


async def _stop(
    service: Drainable,
    signals: Signals,
    timeout: float,
    workers: WorkerSupervisor | None,
    hard_exit: Callable[[int], NoReturn],
) -> int:
    started = time.monotonic()
    if workers is not None:
        workers.terminate()
    status = 0
    drain = asyncio.create_task(service.drain(timeout), name="drain")
    forced = asyncio.create_task(signals.second.wait(), name="second-signal")
    await asyncio.wait({drain, forced}, return_when=asyncio.FIRST_COMPLETED)
    forced.cancel()
    if not drain.done():
        drain.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        try:
            await drain
        except Exception as exc:  # report, then stop anyway
            log.error("drain failed: %s: %s", type(exc).__name__, str(exc)[:300])
            status = 1
    status = max(status, await _close(service, signals, timeout, hard_exit))
    if workers is not None:
        left = 0.0 if signals.second.is_set() else timeout - (time.monotonic() - started)
        await workers.aclose(max(1.0, left + 1.0))
    log.info("stopped after %.1fs", time.monotonic() - started)
    return status


def run(main: Coroutine[object, None, int], *, fast_loop: bool = True) -> int:
    """Run ``main`` to its exit status on a fresh event loop (uvloop when ``fast_loop``)."""
    factory = None
    if fast_loop:
        with contextlib.suppress(ImportError):
            import uvloop

            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
