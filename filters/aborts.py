"""Backend aborts: ``POST /abort_request {"rid": …}`` to the replica that serves a stream the
gateway ended at its tenant's budget (SGLang's endpoint; the emulator has the same), so the GPU
stops generating tokens nobody will read.

Fire and forget: :meth:`Aborter.abort` returns at once (the client's closing chunk never waits
on it); the call runs in a task this object owns, bounded by ``timeout``; each outcome is
counted (``tokenweir_filters_backend_aborts_total{result}``: sent, failed) and a failure is
logged (at most once per 10 s, with the number held back). ``aclose()`` cancels what is left.

:meth:`Aborter.abort_everywhere` is the awaited form for a request whose replica is unknown (an
idempotency claim whose client or holder went away before an answer named its replica): the
abort goes to every replica of the pool, and the caller learns whether all of them answered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from prometheus_client import Counter

from filters.background import BackgroundCalls
from runtime.throttled_log import ThrottledLog

__all__ = ["ABORT_PATH", "Aborter"]

ABORT_PATH = "/abort_request"

_log = logging.getLogger(__name__)


class Aborter(BackgroundCalls):
    def __init__(
        self,
        counter: Counter,
        *,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(aiohttp.ClientTimeout(total=timeout))
        self._counter = counter  # a Counter with the label ``result``
        self._log = ThrottledLog(clock, 10.0, _log)

    def abort(self, host: str, rid: str) -> None:
        """Ask ``host`` (``ip:port``) to abort request ``rid``; returns at once."""
        self.spawn(self._send(host, rid))

    async def abort_everywhere(self, hosts: tuple[str, ...], rid: str, timeout: float) -> bool:
        """Ask every host to abort ``rid`` (an unknown rid is no error: SGLang answers 200);
        True when all of them answered within ``timeout`` seconds (the request runs nowhere
        any more: it was aborted, or had ended)."""
        if not hosts:
            return False
        calls = [self._send(h, rid, timeout) for h in hosts]
        return all(await asyncio.gather(*calls))

    async def _send(self, host: str, rid: str, timeout: float | None = None) -> bool:
        url = f"http://{host}{ABORT_PATH}"
        bound = aiohttp.ClientTimeout(total=timeout) if timeout is not None else self._timeout
        try:
            async with self.session.post(url, json={"rid": rid}, timeout=bound) as r:
                await r.read()
                ok = r.status < 400
                why = f"HTTP {r.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            ok, why = False, f"{type(exc).__name__}: {exc}"
        self._counter.labels("sent" if ok else "failed").inc()
        if not ok:
            self._log.warning("backend abort of %s at %s failed: %s", rid, host, why)
        return ok
