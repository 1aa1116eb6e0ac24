"""Keeps every child of ``tokenweir up`` running: a part that dies is started again, with backoff.

Each watched part (Redis, an emulator, the rate-limit service, the filter server, an Envoy, a
control-plane child, Prometheus) gets one task that waits for it to exit, logs the exit status
and the tail of its log, waits a backoff delay and starts it again (same argv, so the same port),
until it serves again (its port open). The rule (docs/operations.md, "When a part dies"):

- the delay doubles with each failure in a row, from ``Backoff.base`` up to ``Backoff.cap``,
  each drawn with ±``jitter`` (a shared fault does not restart everything in lock step);
- a part that ran ``stable_after`` seconds before it died "ran fine": its count starts again at 1
  (one crash an hour is restarted at once, every time);
- a part is never given up on once it has served: a crash loop keeps being retried at the capped
  delay, each try logged and counted (``tokenweir_up_child_restarts_total{result="failed"}``,
  ``tokenweir_up_child_up`` 0). Stopping the whole mesh because one part loops would take down
  what still serves (the gateway answers from local buckets without Redis, from the other replicas
  without one emulator). Only a part's *first* start failing ends ``up`` (:class:`tokenweir.up.Mesh`).

The metrics are a collector (:meth:`Supervisor.collector`) that ``up`` registers on the control
plane's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.tasks import stop_task

__all__ = ["Backoff", "Part", "Supervisor"]

log = logging.getLogger("tokenweir.up")


@dataclass(frozen=True)
class Backoff:
    """Seconds between a death and the next start: ``base * 2**(failures-1)``, at most ``cap``,
    times a factor drawn uniformly in ``[1 - jitter, 1 + jitter]``."""

    base: float = 0.25
    cap: float = 30.0
    jitter: float = 0.2
    stable_after: float = 10.0  # a part up this long before it died ran fine

    def delay(self, failures: int, rng: random.Random) -> float:
        raw = min(self.cap, self.base * 2.0 ** max(0, failures - 1))
        return raw * (1.0 + self.jitter * (2.0 * rng.random() - 1.0))


@dataclass
class Part:
    """One supervised part. ``restart`` starts it again and returns once it serves (raising if it
    does not), with a short description of the new process (``pid N``)."""

    name: str
    alive: Callable[[], bool]
    exit_status: Callable[[], object]
    log_tail: Callable[[], str]
    restart: Callable[[], Awaitable[str]]


@dataclass
class _State:
    started: float
    up: bool = True
    exits: int = 0
    restarts_ok: int = 0
    restarts_failed: int = 0
    failures: int = 0  # deaths and failed starts in a row
    tries: int = 0  # starts again begun (the one under way included)
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Supervisor:
    """``watch(part)`` while the mesh starts, ``start()`` once it is up, ``aclose()`` before
    stopping the children (so that a stop is not taken for a death)."""

    def __init__(
        self,
        *,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = log.warning,
        poll: float = 0.2,
    ) -> None:
        self.backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._clock = clock
        self._say = say
        self._poll = poll
        self._parts: dict[str, Part] = {}
        self._state: dict[str, _State] = {}
        self._running = False

    def watch(self, part: Part) -> None:
        self._parts[part.name] = part
        self._state[part.name] = _State(started=self._clock())
        if self._running:
            self._spawn(part)

    def start(self) -> None:
        self._running = True
        for part in self._parts.values():
            self._spawn(part)

    def restarts(self, name: str) -> int:
        """How many starts of ``name`` again have begun, the one under way included (a restarted
        Envoy's fresh ``--base-id``: the dead one's shared memory may still be there)."""
        st = self._state.get(name)
        return 0 if st is None else st.tries

    def is_up(self, name: str) -> bool:
        st = self._state.get(name)
        return st is not None and st.up

    def _spawn(self, part: Part) -> None:
        st = self._state[part.name]
        if st.task is None or st.task.done():
            st.task = asyncio.get_running_loop().create_task(
                self._keep(part), name=f"supervise {part.name}"
            )

    async def _keep(self, part: Part) -> None:
        st = self._state[part.name]
        while True:
            while part.alive():
                await asyncio.sleep(self._poll)
            ran = self._clock() - st.started
            st.up = False
            st.exits += 1
            st.failures = 1 if ran >= self.backoff.stable_after else st.failures + 1
            delay = self.backoff.delay(st.failures, self._rng)
            tail = part.log_tail().strip()
            self._say(
                f"tokenweir up: {part.name} exited with {part.exit_status()} after {ran:.1f}s; "
                f"starting it again in {delay:.2f}s ({self._in_a_row(st)})"
                + (f"; its log ends:\n{_indent(tail)}" if tail else "")
            )
            await self._bring_back(part, st, delay)

    async def _bring_back(self, part: Part, st: _State, delay: float) -> None:
        while True:
            await asyncio.sleep(delay)
            st.tries += 1
            try:
                what = await part.restart()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure to start is one failed try, never the end
                st.restarts_failed += 1
                st.failures += 1
                delay = self.backoff.delay(st.failures, self._rng)
                self._say(
                    f"tokenweir up: {part.name} did not start again ({self._in_a_row(st)}); "
                    f"next try in {delay:.2f}s: {_indent(str(exc).strip())}"
                )
                continue
            st.restarts_ok += 1
            st.up = True
            st.started = self._clock()
            self._say(f"tokenweir up: {part.name} rejoined ({what})")
            return

    @staticmethod
    def _in_a_row(st: _State) -> str:
        return "first failure" if st.failures == 1 else f"{st.failures} failures in a row"

    def collector(self) -> Collector:
        return _Metrics(self)

    def samples(self) -> Iterator[tuple[str, _State]]:
        yield from sorted(self._state.items())

    async def aclose(self) -> None:
        """Stop watching (a restart under way is cancelled; the caller stops the children)."""
        self._running = False
        for st in self._state.values():
            task, st.task = st.task, None
            await stop_task(task, log=log)


class _Metrics(Collector):
    def __init__(self, sup: Supervisor) -> None:
        self._sup = sup

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "tokenweir_up_child_up",
            "1 while a child of `tokenweir up` runs, 0 from its death until it serves again",
            labels=["child"],
        )
        exits = CounterMetricFamily(
            "tokenweir_up_child_exits",
            "Deaths of a child of `tokenweir up` (any exit it was not asked for)",
            labels=["child"],
        )
        restarts = CounterMetricFamily(
            "tokenweir_up_child_restarts",
            "Starts of a dead child again, by result (ok: it serves again; failed: it did not)",
            labels=["child", "result"],
        )
        failures = GaugeMetricFamily(
            "tokenweir_up_child_failures_in_a_row",
            "Deaths and failed starts of a child since it last ran fine (the backoff's exponent)",
            labels=["child"],
        )
        for name, st in self._sup.samples():
            up.add_metric([name], 1.0 if st.up else 0.0)
            exits.add_metric([name], st.exits)
            restarts.add_metric([name, "ok"], st.restarts_ok)
            restarts.add_metric([name, "failed"], st.restarts_failed)
            failures.add_metric([name], st.failures)
        yield up
        yield exits
        yield restarts
        yield failures


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines()) if "\n" in text else text
