"""The filter server's PD state across reloads: the replicas' in-flight loads, ejected prefill
replicas, and the prefill calls it makes (one aiohttp session; every call a task ``aclose``
stops).

Fan-out design: Envoy carries the client's request to the decode replica (the pool's cluster,
``x-tokenweir-endpoint`` naming it), so streaming, timeouts, retries, the usage meter and
settlement stay on the ordinary path; the filter server sends the same body to the prefill
replica itself, at the request's body phase, and reads that answer to its end (SGLang's prefill
answers once the KV is handed over). A prefill call that fails ejects that replica for
``eject_for``, and so does a decode side that never answered or got Envoy's 502/503/504; the
decode side of a failed prefill fails on its own (its KV never comes: SGLang's decode answers
500), and a decode side that fails or whose client leaves cancels the prefill call (the prefill
server aborts the request when its client goes).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Histogram

from filters.background import BackgroundCalls
from filters.plugins.pd.pick import pick_decode, pick_prefill
from policy.disaggregation import Disaggregation
from runtime.throttled_log import ThrottledLog

__all__ = ["Flight", "PdHub", "PdMetrics"]

_log = logging.getLogger(__name__)
_ROOM_BITS = 63  # SGLang's routers draw the room from [0, 2**63)


class PdMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "tokenweir_pd_"
        self.requests = Counter(
            p + "requests", "PD requests by outcome (ok, prefill_failed, decode_failed)",
            ["pool", "outcome"], registry=registry,
        )  # fmt: skip
        self.prefill_seconds = Histogram(
            p + "prefill_call_seconds",
            "the filter server's prefill call, sent to answered (queue + prefill + KV hand-over)",
            ["pool"], registry=registry,
        )  # fmt: skip


@dataclass(eq=False)
class Flight:
    """One PD request: its pair, its room, the prefill call."""

    pool: str
    prefill: str  # host:port
    decode: str  # host:port
    room: int
    tokens: int  # prompt tokens (prefill backlog)
    held: int  # prompt + max new tokens (decode KV)
    started: float
    eject_for: float = 5.0
    task: asyncio.Task[int | None] | None = None
    prefill_error: str | None = None
    decode_status: int | None = None
    finished: bool = field(default=False)


class PdHub(BackgroundCalls):
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__()
        self.metrics = PdMetrics(registry)
        self._clock = clock
        self._rng = rng or random.Random()
        self.backlog: dict[str, int] = {}  # prefill replica -> prompt tokens in flight
        self.decode_tokens: dict[str, int] = {}  # decode replica -> tokens held
        self.decode_requests: dict[str, int] = {}
        self._ejected_until: dict[str, float] = {}
        self._log = ThrottledLog(clock, 10.0, _log)

    # ---- picking ------------------------------------------------------------------------
    def start(self, pool: str, pd: Disaggregation, key: bytes, tokens: int, held: int) -> Flight:
        """Pick the pair and a room; count the request in on both replicas."""
        now = self._clock()
        ejected = frozenset(r for r, t in self._ejected_until.items() if t > now)
        prefill = pick_prefill(
            key, [str(r.address) for r in pd.prefill], self.backlog, tokens, ejected=ejected
        )
        decodes = [str(a) for a in pd.decode]
        decodes = [d for d in decodes if d not in ejected] or decodes
        decode = pick_decode(decodes, self.decode_tokens, self.decode_requests)
        room = self._rng.getrandbits(_ROOM_BITS)
        flight = Flight(pool, prefill, decode, room, tokens, held, now, pd.eject_for)
        self.backlog[prefill] = self.backlog.get(prefill, 0) + tokens
        self.decode_tokens[decode] = self.decode_tokens.get(decode, 0) + held
        self.decode_requests[decode] = self.decode_requests.get(decode, 0) + 1
        return flight

    @staticmethod
    def bootstrap_port(pd: Disaggregation, prefill: str) -> int:
        return next(r.bootstrap_port for r in pd.prefill if str(r.address) == prefill)

    # ---- the prefill call ---------------------------------------------------------------
    def send_prefill(self, flight: Flight, path: str, body: bytes, pd: Disaggregation) -> None:
        """Send the prefill side; returns at once (the call is a task of this hub)."""
        flight.task = self.spawn(
            self._prefill(flight, path, body, pd), name=f"pd-prefill-{flight.room}"
        )

    async def _prefill(
        self, flight: Flight, path: str, body: bytes, pd: Disaggregation
    ) -> int | None:
        status: int | None = None
        try:
            async with self.session.post(
                f"http://{flight.prefill}{path}", data=body,
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=pd.prefill_timeout),
            ) as resp:  # fmt: skip
                status = resp.status
                text = await resp.read()
            if status >= 400:
                flight.prefill_error = f"HTTP {status}: {text[:300].decode(errors='replace')}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            flight.prefill_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.backlog[flight.prefill] = max(
                0, self.backlog.get(flight.prefill, 0) - flight.tokens
            )
            self.metrics.prefill_seconds.labels(flight.pool).observe(self._clock() - flight.started)
        if flight.prefill_error is not None:
            self._ejected_until[flight.prefill] = self._clock() + pd.eject_for
            self._log.warning(
                "PD prefill %s (room %d) failed: %s", flight.prefill, flight.room,
                flight.prefill_error,
            )  # fmt: skip
        return status

    # ---- the end ------------------------------------------------------------------------
    def finish(self, flight: Flight) -> str:
        """The decode side ended (answered, failed, or the client left): count the request out,
        cancel a prefill call still running, record the outcome."""
        if flight.finished:
            return "ok"
        flight.finished = True
        d = flight.decode
        self.decode_tokens[d] = max(0, self.decode_tokens.get(d, 0) - flight.held)
        self.decode_requests[d] = max(0, self.decode_requests.get(d, 0) - 1)
        decode_ok = flight.decode_status is not None and flight.decode_status < 400
        task = flight.task
        if task is not None and not task.done() and not decode_ok:
            task.cancel()  # the prefill server aborts the request when its client leaves
        if flight.prefill_error is not None:
            outcome = "prefill_failed"
        elif not decode_ok:
            outcome = "decode_failed"
            # no answer, or Envoy's 502/503/504 (refused, reset, timed out): the decode replica
            # is gone or sick; it would otherwise look the least loaded and draw every request
            if flight.decode_status is None or flight.decode_status >= 502:
                self._ejected_until[d] = self._clock() + flight.eject_for
        else:
            outcome = "ok"
        self.metrics.requests.labels(flight.pool, outcome).inc()
        return outcome
