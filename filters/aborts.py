"""Backend aborts: ``POST /abort_request {"rid": …}`` to the replica that serves a stream the
gateway ended at its tenant's budget (SGLang's endpoint; the emulator has the same), so the GPU
stops generating tokens nobody will read.

Fire and forget: :meth:`Aborter.abort` returns at once (the client's closing chunk never waits
on it); the call runs in a task this object owns, bounded by ``timeout``; each outcome is
counted (``tokenweir_filters_backend_aborts_total{result}``: sent, failed) and a failure is
logged (at most once per 10 s, with the number held back). ``aclose()`` cancels what is left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from runtime.throttled_log import ThrottledLog

__all__ = ["ABORT_PATH", "Aborter"]

ABORT_PATH = "/abort_request"

_log = logging.getLogger(__name__)


class Aborter:
    def __init__(
        self,
        counter: Any,
        *,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counter = counter  # a Counter with the label ``result``
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = ThrottledLog(clock, 10.0, _log)

    def abort(self, host: str, rid: str) -> None:
        """Ask ``host`` (``ip:port``) to abort request ``rid``; returns at once."""
        task = asyncio.get_running_loop().create_task(self._send(host, rid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, host: str, rid: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        try:
            async with self._session.post(f"http://{host}{ABORT_PATH}", json={"rid": rid}) as r:
                await r.read()
                ok = r.status < 400
                why = f"HTTP {r.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        self._counter.labels("sent" if ok else "failed").inc()
        if not ok:
            self._log.warning("backend abort of %s at %s failed: %s", rid, host, why)

    async def wait(self) -> None:
        """Until the aborts in flight are done (tests, drain)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
