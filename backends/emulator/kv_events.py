"""The emulator's KV-event publisher: SGLang's ``ZmqEventPublisher`` behaviour on asyncio.

- a PUB socket (high-water mark ``hwm``) bound when the endpoint has ``*`` (or is ipc/inproc),
  else connected, exactly as SGLang decides; each batch goes out as ``(topic, seq, payload)``
  with ``seq`` counting from 0 in this process;
- the last ``buffer_steps`` batches kept for the optional ROUTER replay socket, which answers a
  request ``(b"", start seq)`` with every kept batch ``seq >= start`` and then the end marker -1;
- ``publish`` never blocks (a PUB socket drops for slow subscribers at its high-water mark, which
  is why subscribers check sequence numbers and use the replay socket).

The replay loop is a task this object owns; ``aclose()`` stops it and closes the sockets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from prefixindex.wire import (
    END_SEQ,
    KvEvent,
    KVEventBatch,
    KvEventsConfig,
    decode_seq,
    encode_batch,
    encode_seq,
    should_bind,
)
from runtime.tasks import stop_task

__all__ = ["KvEventPublisher"]

log = logging.getLogger("backends.emulator")


class KvEventPublisher:
    """Publishes the radix cache's events; build, ``await start()``, ``publish``, ``aclose()``."""

    def __init__(
        self, config: KvEventsConfig, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self._wall_clock = wall_clock
        self._seq = itertools.count()
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(
            maxlen=config.buffer_steps
        )
        self._topic = config.topic.encode()
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.endpoint: str | None = None  # the address bound or connected (port resolved)
        self.replay_endpoint: str | None = None
        self.published = 0

    async def start(self) -> None:
        ctx = zmq.asyncio.Context()
        self._ctx = ctx
        pub: zmq.Socket[bytes] = zmq.Socket(ctx, zmq.PUB)  # synchronous: PUB never blocks
        pub.setsockopt(zmq.LINGER, 0)
        pub.set_hwm(self.config.hwm)
        self._pub = pub
        if should_bind(self.config.endpoint):
            pub.bind(self.config.endpoint)
            self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            pub.connect(self.config.endpoint)
            self.endpoint = self.config.endpoint
        if self.config.replay_endpoint is not None:
            replay = ctx.socket(zmq.ROUTER)
            replay.setsockopt(zmq.LINGER, 0)
            replay.bind(self.config.replay_endpoint)
            self._replay = replay
            self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
            self._task = asyncio.create_task(self._serve_replay(replay), name="kv-events-replay")
        log.info("KV events on %s (replay %s)", self.endpoint, self.replay_endpoint)

    def publish(self, events: list[KvEvent]) -> None:
        """Send one batch now (dropped by ZMQ when the high-water mark is reached)."""
        if self._pub is None or not events:
            return
        seq = next(self._seq)
        payload = encode_batch(KVEventBatch(ts=self._wall_clock(), events=events))
        self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self._topic, encode_seq(seq), payload], flags=zmq.NOBLOCK)
        self.published += 1

    async def _serve_replay(self, replay: zmq.asyncio.Socket) -> None:
        while True:
            frames = await replay.recv_multipart()
            if len(frames) != 3:
                log.warning("KV events: invalid replay request with %d frames", len(frames))
                continue
            client, _, raw = frames
            try:
                start = decode_seq(raw)
            except ValueError:
                log.warning("KV events: invalid replay start %r", raw)
                continue
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await replay.send_multipart([client, b"", encode_seq(seq), payload])
            await replay.send_multipart([client, b"", encode_seq(END_SEQ), b""])

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
