"""The I/O edge of the prefix index: subscribe to N replicas' KV-event streams over ZMQ.

One asyncio task per replica (owned by ``KvEventSubscriber``; ``aclose()`` stops them):

- a SUB socket on the replica's PUB endpoint feeds every batch to ``PrefixIndex.apply``;
- when a batch cannot be applied (a gap, no baseline yet) or every ``probe_interval_s`` (the
  heartbeat that keeps a quiet replica known and finds a lost last batch), a DEALER asks the
  replica's ROUTER replay socket for everything from ``resync_from``, and applies the answer;
- a disconnect of the SUB socket (the replica's process went away) makes the index forget the
  replica and the socket is replaced (what the old one still queued came from a dead process):
  the next incarnation starts from an empty cache and is resynced from seq 0.

Without a replay endpoint a replica is known only while batches keep arriving within the index's
``stale_after_s``.

The SUB and monitor sockets are plain (blocking-API) ZMQ sockets read with ``NOBLOCK`` when the
event loop sees their file descriptor readable, not ``zmq.asyncio`` sockets: pyzmq's asyncio
layer makes a future and re-registers the descriptor for every receive and every poll, which was
~19% of the filter server's busy samples on the picker route (docs/benchmarks.md). ZMQ's
descriptor is edge-triggered: it signals a change, not a level, so after each wake-up the
sockets are read until their ``EVENTS`` say nothing is left (or the drain's budget is spent and
the task takes another turn at once). The replay DEALER (one short exchange per probe) stays on
``zmq.asyncio``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from prefixindex.errors import KvEventDecodeError
from prefixindex.index import Applied, PrefixIndex
from prefixindex.wire import (
    END_SEQ,
    decode_for_index,
    decode_index_frame,
    decode_seq,
    encode_seq,
)

__all__ = ["KvEventSubscriber", "ReplicaFeed"]

log = logging.getLogger("prefixindex")
_DRAIN_MAX = 256  # batches applied per wake-up before the loop gets a turn
_DRAIN_SECONDS = 0.005  # ... or this much work, so requests on the same loop are not held


@dataclass(frozen=True, slots=True)
class ReplicaFeed:
    """Where one replica publishes (``tcp://host:port``, as a subscriber connects)."""

    name: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


class KvEventSubscriber:
    """Feeds ``index`` from the replicas' event streams; ``await start()``, then ``aclose()``."""

    def __init__(
        self,
        index: PrefixIndex,
        feeds: Sequence[ReplicaFeed],
        *,
        clock: Callable[[], float] = time.monotonic,
        probe_interval_s: float = 1.0,
        replay_timeout_s: float = 2.0,
    ) -> None:
        self.index = index
        self.feeds = list(feeds)
        self._clock = clock
        self._probe_interval_s = probe_interval_s
        self._replay_timeout_s = replay_timeout_s
        self._ctx: zmq.asyncio.Context | None = None  # the replay DEALERs
        self._sync: zmq.Context[zmq.Socket[bytes]] | None = None  # SUB and monitor sockets
        self._tasks: list[asyncio.Task[None]] = []
        self.decode_errors = 0

    async def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sync = zmq.Context()
        for feed in self.feeds:
            self.index.add_replica(feed.name)
            task = asyncio.create_task(self._follow(feed), name=f"kv-events-{feed.name}")
            self._tasks.append(task)

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:  # a cancel of aclose itself (a caller's time limit) is passed on
            await asyncio.wait(tasks)
        for ctx in (self._ctx, self._sync):
            if ctx is not None:
                ctx.destroy(linger=0)  # closes any socket a cancelled task left open
        self._ctx = self._sync = None

    async def _follow(self, feed: ReplicaFeed) -> None:
        while True:
            await self._follow_connection(feed)
            # the publisher went away: batches still queued in the old socket belong to a dead
            # process, so a fresh socket follows the next one
            log.info("KV events: %s disconnected; forgetting it", feed.name)
            self.index.forget(feed.name, "disconnected")

    async def _follow_connection(self, feed: ReplicaFeed) -> None:
        """Follow one connection of ``feed`` until its publisher disconnects."""
        assert self._sync is not None
        loop = asyncio.get_running_loop()
        sub = self._sync.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, feed.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sub.connect(feed.endpoint)
        wake = _Wake(loop, sub.fileno(), monitor.fileno())
        next_probe = self._clock()
        try:
            while True:
                if feed.replay_endpoint is not None and self._clock() >= next_probe:
                    # what the SUB socket already holds first: the replay then asks only for
                    # what is missing, not for batches that would then arrive as duplicates;
                    # while a backlog is still queued the stream is flowing, so the probe
                    # waits for it (a gap in it still asks at once)
                    gap, more = self._drain(feed, sub)
                    if gap or not more:
                        await self._replay(feed)
                        next_probe = self._clock() + self._probe_interval_s
                if wake.take_monitor() and _disconnected(monitor):
                    return
                wake.clear()  # before reading: a signal from here on wakes the wait below
                gap, more = self._drain(feed, sub)
                if gap:
                    next_probe = self._clock()  # a gap: ask the replay socket now
                if more or gap or wake.monitor:
                    await asyncio.sleep(0)  # the rest after the loop's other tasks had a turn
                    continue
                if feed.replay_endpoint is not None:
                    wake.at(next_probe - self._clock(), next_probe)
                await wake.wait()
        finally:
            wake.close()
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    def _drain(self, feed: ReplicaFeed, sub: zmq.Socket[bytes]) -> tuple[bool, bool]:
        """Apply the batches ``sub`` holds (up to ``_DRAIN_MAX``, or ``_DRAIN_SECONDS`` of
        work): a busy loop does not fall behind the publishers and leave the batches to the
        next replay probe (each then decoded twice), and requests on the loop are not held.
        ``(gap, more)``: the replica needs a replay; batches were left for the next turn."""
        gap = False
        until = time.perf_counter() + _DRAIN_SECONDS
        for _ in range(_DRAIN_MAX):
            try:
                parts = sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return gap, False
            gap = self._on_message(feed, parts) or gap
            if time.perf_counter() >= until:
                break
        return gap, True

    def _on_message(self, feed: ReplicaFeed, parts: list[bytes]) -> bool:
        """Apply one live batch; True when the replica needs a replay."""
        try:
            seq, batch = decode_index_frame(parts, self.index.anchor_every)
        except KvEventDecodeError as exc:
            self.decode_errors += 1
            log.warning("KV events from %s: %s", feed.name, exc)
            return False
        self.index.heard(feed.name, self._clock())
        return self.index.apply(feed.name, seq, batch, live=True) is Applied.NEEDS_RESYNC

    async def _replay(self, feed: ReplicaFeed) -> None:
        """Ask the replay socket for what the index misses; apply it; a timeout changes nothing."""
        assert self._ctx is not None and feed.replay_endpoint is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(feed.replay_endpoint)
        try:
            start = self.index.resync_from(feed.name)
            await dealer.send_multipart([b"", encode_seq(start)])
            while True:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the answer and
                # drops a cancel that arrives as it completes, so aclose waited forever
                async with asyncio.timeout(self._replay_timeout_s):
                    frames = await dealer.recv_multipart()
                if len(frames) != 3:
                    raise KvEventDecodeError(f"replay answer has {len(frames)} parts, 3 expected")
                seq = decode_seq(frames[1])
                if seq == END_SEQ:
                    break
                batch = decode_for_index(frames[2], self.index.anchor_every)
                self.index.apply(feed.name, seq, batch, live=False)
            self.index.heard(feed.name, self._clock())
        except TimeoutError:
            log.debug("KV events: replay from %s timed out", feed.name)
        except KvEventDecodeError as exc:
            self.decode_errors += 1
            log.warning("KV events: replay from %s: %s", feed.name, exc)
        finally:
            dealer.close(linger=0)


class _Wake:
    """What wakes one connection's task: its SUB descriptor, its monitor's descriptor (noted
    apart, so the monitor is read only when it signalled: reading ``EVENTS`` costs a system
    call or two), and the next probe's timer (one timer per probe, not one per wait)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sub_fd: int, monitor_fd: int) -> None:
        self._loop, self._fds = loop, (sub_fd, monitor_fd)
        self._event = asyncio.Event()
        self.monitor = True  # read it once at the start: it may have signalled before
        self._timer: asyncio.TimerHandle | None = None
        self._timer_key: float | None = None
        loop.add_reader(sub_fd, self._event.set)
        loop.add_reader(monitor_fd, self._on_monitor)

    def _on_monitor(self) -> None:
        self.monitor = True
        self._event.set()

    def take_monitor(self) -> bool:
        """Whether the monitor signalled since the last call."""
        signalled, self.monitor = self.monitor, False
        return signalled

    def clear(self) -> None:
        self._event.clear()

    def at(self, delay: float, key: float) -> None:
        """Wake in ``delay`` s (the probe ``key`` is due), unless that timer is already set."""
        if key != self._timer_key:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_later(max(0.0, delay), self._on_timer)
            self._timer_key = key

    def _on_timer(self) -> None:
        # the loop's clock may run a little ahead of the subscriber's: if the probe is not due
        # yet when this wakes it, the next ``at`` sets a new timer for what is left
        self._timer = self._timer_key = None
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for fd in self._fds:
            self._loop.remove_reader(fd)


def _readable(sock: zmq.Socket[bytes]) -> bool:
    """Whether ``sock`` holds a message (reading ``EVENTS`` also re-arms its descriptor)."""
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


def _disconnected(monitor: zmq.Socket[bytes]) -> bool:
    """Whether the monitor reported the publisher gone; reads every event it holds."""
    while _readable(monitor):
        event = parse_monitor_message(monitor.recv_multipart(flags=zmq.NOBLOCK))
        if event["event"] == zmq.EVENT_DISCONNECTED:
            return True
    return False
