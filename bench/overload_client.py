"""A small asyncio streaming client for the overload benchmark: per-chunk timing, rejections,
Retry-After, and three retry behaviours.

One *logical request* (an ``Arrival``) makes one or more *attempts* (HTTP requests). Every
attempt is recorded (``Attempt``): when it was sent, its status, when its first token came, the
gaps between its chunks, how many tokens it got, the Retry-After it was told and whether it
followed a wait that honoured one. Behaviours on a failed attempt:

- ``honour``: told a Retry-After (``retry-after-ms`` first, as OpenAI's client reads it, else
  ``Retry-After`` seconds), wait that long plus jitter (0..``jitter`` of it, never less than
  told), then retry; not told: retry after an exponential back-off with full jitter only when
  ``retry_untold`` is set, else give up. ``max_wait`` (None: no limit) caps each wait, told or
  backed off: the seconds-long smoke run's clients come back within its phases, however far
  off the gateway's promise on the smoke's small pool (the real run honours every second).
- ``immediate``: retry at once, whatever the answer.
- ``none``: never retry.

Each behaviour stops after ``max_attempts``. An attempt that has no first token after the lane's
``patience`` is abandoned (the connection closes; a real user gives up). The clock and the
random source are injected; entry points pass ``loop.time`` and a seeded ``random.Random``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
from overload_workload import Arrival

__all__ = ["Attempt", "Behaviour", "Client", "parse_retry_after"]


@dataclass(frozen=True, slots=True)
class Behaviour:
    name: str  # "honour" | "immediate" | "none"
    max_attempts: int = 4
    jitter: float = 0.25
    retry_untold: bool = False
    backoff_base: float = 0.5
    backoff_max: float = 8.0
    max_wait: float | None = None  # the longest wait between two attempts (None: any)

    def __post_init__(self) -> None:
        if self.name not in ("honour", "immediate", "none"):
            raise ValueError(f"unknown behaviour {self.name!r}")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.max_wait is not None and self.max_wait <= 0:
            raise ValueError("max_wait must be > 0 (or None: no limit)")


@dataclass(slots=True, eq=False)  # identity: attempts sit in a set while in flight
class Attempt:
    request: int  # index of the logical request
    lane: str
    number: int  # 1 for the first attempt
    sent: float  # seconds from the run's start
    status: int = 0  # 0: no HTTP answer (connection error or abandoned)
    answered: float | None = None  # when the status line came
    first_token: float | None = None
    done: float | None = None
    tokens: int = 0  # content chunks received
    token_times: list[float] = field(default_factory=list)
    ok: bool = False  # 200, streamed to a finish and [DONE]
    retry_after: float | None = None  # seconds the answer said to wait
    told_to_wait: float | None = None  # the previous answer's Retry-After, when honoured
    error: str = ""  # "", "abandoned", "connection", "stream", or the body's error code
    finish_reason: str | None = None  # the stream's finish_reason ("stop", "length", ...)
    usage: dict[str, int] | None = None  # the usage chunk's counts, when one came

    @property
    def rejected(self) -> bool:
        """Answered with an error status before any token (a shed, a quota, a queue timeout)."""
        return self.status not in (0, 200) and self.first_token is None

    @property
    def admitted(self) -> bool:
        return self.status == 200


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait: ``retry-after-ms`` when present, else ``Retry-After`` as seconds."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None  # an HTTP date: not sent by any arm here


class Client:
    """Sends logical requests to ``url`` and records every attempt in ``attempts``."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        *,
        model: str,
        keys: Mapping[str, list[str]],
        patience: Mapping[str, float],
        behaviour: Behaviour,
        clock: Callable[[], float],
        rng: random.Random,
        sleep: Callable[[float], object] = asyncio.sleep,
        body_extra: Mapping[str, object] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.session = session
        self.url = url
        self.model = model
        self.keys = keys
        self.patience = patience
        self.behaviour = behaviour
        self.clock = clock
        self.rng = rng
        self._sleep = sleep
        self.body_extra = dict(body_extra or {})  # merged into every body (wins over defaults)
        self.extra_headers = dict(headers or {})
        self.attempts: list[Attempt] = []
        self.t0 = clock()

    def now(self) -> float:
        return self.clock() - self.t0

    def waiting(self) -> dict[str, int]:
        """Attempts in flight that have neither a first token nor a final answer, per lane."""
        out = {"interactive": 0, "batch": 0}
        for a in self._in_flight:
            out[a.lane] += 1
        return out

    _in_flight: set[Attempt]

    def start(self) -> None:
        self._in_flight = set()
        self.t0 = self.clock()

    async def run(self, index: int, arrival: Arrival) -> None:
        """Send one logical request at its time, retrying as the behaviour says."""
        delay = arrival.at - self.now()
        if delay > 0:
            await self._sleep(delay)  # type: ignore[misc]
        told: float | None = None
        b = self.behaviour
        for number in range(1, b.max_attempts + 1):
            attempt = Attempt(index, arrival.lane, number, self.now(), told_to_wait=told)
            self.attempts.append(attempt)
            await self._one(attempt, arrival)
            if attempt.ok or b.name == "none" or number == b.max_attempts:
                return
            if attempt.first_token is not None:
                return  # a stream that broke after its first token is not retried
            told = None
            if b.name == "immediate":
                continue
            if attempt.retry_after is not None:
                told = attempt.retry_after
                wait = told * (1.0 + self.rng.uniform(0.0, b.jitter))
            elif b.retry_untold:
                cap = min(b.backoff_max, b.backoff_base * 2 ** (number - 1))
                wait = self.rng.uniform(0.0, cap)
            else:
                return
            await self._sleep(wait if b.max_wait is None else min(wait, b.max_wait))  # type: ignore[misc]

    def _body(self, arrival: Arrival) -> dict[str, object]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": arrival.prompt}],
            "max_tokens": arrival.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.body_extra,
        }

    def _headers(self, arrival: Arrival) -> dict[str, str]:
        keys = self.keys.get(arrival.lane) or []
        if not keys:
            return dict(self.extra_headers)
        return {**self.extra_headers, "authorization": f"Bearer {keys[arrival.tenant % len(keys)]}"}

    async def _one(self, a: Attempt, arrival: Arrival) -> None:
        """One attempt. Patience covers the wait for an answer and the first token only: a
        stream that started is read to its end, however long it takes."""
        self._in_flight.add(a)
        first = asyncio.Event()
        stream = asyncio.ensure_future(self._stream(a, arrival, first))
        started = asyncio.ensure_future(first.wait())
        try:
            await asyncio.wait(
                (stream, started), timeout=self.patience[a.lane],
                return_when=asyncio.FIRST_COMPLETED,
            )  # fmt: skip
            if not stream.done() and not first.is_set():
                a.error = "abandoned"  # the connection closes: a real user gives up
                stream.cancel()
            await stream
        except asyncio.CancelledError:
            if a.error != "abandoned" or not stream.cancelled():
                raise
        except (aiohttp.ClientError, ConnectionError) as exc:
            a.error = a.error or f"connection: {type(exc).__name__}"
        finally:
            started.cancel()
            if not stream.done():
                stream.cancel()
            self._in_flight.discard(a)
            a.done = self.now()

    async def _stream(self, a: Attempt, arrival: Arrival, first: asyncio.Event) -> None:
        async with self.session.post(
            self.url, json=self._body(arrival), headers=self._headers(arrival)
        ) as resp:
            a.status = resp.status
            a.answered = self.now()
            if resp.status != 200:
                self._in_flight.discard(a)
                a.retry_after = parse_retry_after(resp.headers)
                a.error = _error_code(await resp.read())
                return
            finished = done = False
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                kind, data = _chunk(payload)
                _record(a, data)
                if kind == "error":
                    a.error = "stream"
                    break
                if kind == "token":
                    t = self.now()
                    if a.first_token is None:
                        a.first_token = t
                        first.set()
                        self._in_flight.discard(a)
                    a.tokens += 1
                    a.token_times.append(t)
                elif kind == "finish":
                    finished = True
            a.ok = done and finished and a.error == ""
            if not a.ok and not a.error:
                a.error = "stream"


def _chunk(payload: bytes) -> tuple[str, dict[str, object] | None]:
    """The chunk's kind — ``token`` (a content delta), ``finish`` (stop/length), ``error`` or
    ``other`` — and its JSON object (None when it is not one)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return "error", None
    if not isinstance(data, dict) or "error" in data or data.get("object") == "error":
        return "error", data if isinstance(data, dict) else None
    for choice in data.get("choices") or ():
        reason = choice.get("finish_reason")
        if reason in ("stop", "length"):
            return "finish", data
        if reason is not None:  # "abort" and the like: SGLang's streamed rejection
            return "error", data
        delta = choice.get("delta") or {}
        if delta.get("content"):
            return "token", data
    return "other", data


def _record(a: Attempt, data: dict[str, object] | None) -> None:
    """Keep the stream's finish_reason and its usage counts (the last usage chunk wins)."""
    if data is None:
        return
    for choice in data.get("choices") or ():  # type: ignore[attr-defined]
        if isinstance(choice, dict) and choice.get("finish_reason") is not None:
            a.finish_reason = str(choice["finish_reason"])
    usage = data.get("usage")
    if isinstance(usage, dict):
        a.usage = {k: int(v) for k, v in usage.items() if isinstance(v, int | float)}


def _error_code(body: bytes) -> str:
    """The ``error.code`` (or ``code``) of an OpenAI-style error body, else ``http``."""
    try:
        data = json.loads(body)
    except ValueError:
        return "http"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            code = err.get("code") or err.get("type")
            if code is not None:
                return str(code)
    return "http"
