"""A burst of KV-event batches is applied from the SUB socket, not left to the replay probe.

The subscriber used to take one batch per poll of its sockets; with the filter server's loop
busy, the SUB socket fell behind, the next replay probe fetched the queued batches from the
replica's replay socket, and the same batches then arrived live as duplicates: each decoded
twice (the replay path was 2.5x the live path in a profile of the picker route). A real ZMQ PUB
and ROUTER on ipc:// sockets stand in for a replica here; the replay socket counts the batches
it had to send. The publisher is an XPUB so that the test waits for the subscription itself
rather than a fixed sleep (a PUB drops whatever it sends before the SUB's subscription lands,
and on a loaded machine that took longer than any sleep chosen here)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.asyncio

from prefixindex.index import PrefixIndex
from prefixindex.subscriber import KvEventSubscriber, ReplicaFeed
from prefixindex.wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    decode_seq,
    encode_batch,
    encode_frame,
    encode_seq,
)


def _batch(seq: int) -> KVEventBatch:
    if seq == 0:
        return KVEventBatch(ts=0.0, events=[AllBlocksCleared()])
    return KVEventBatch(ts=float(seq), events=[BlockStored([seq], None, [seq], 1, None)])


async def _replay_server(
    router: zmq.asyncio.Socket, log: list[bytes], sent: list[int], asks: list[int]
) -> None:
    """Answers every request with the batches from its start, then the end marker."""
    while True:
        ident, _, raw = await router.recv_multipart()
        asks.append(decode_seq(raw))
        for seq in range(decode_seq(raw), len(log)):
            await router.send_multipart([ident, b"", encode_seq(seq), log[seq]])
            sent.append(seq)
        await router.send_multipart([ident, b"", encode_seq(END_SEQ), b""])


async def _until(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.01)


@dataclass
class Replica:
    """A replica's two sockets (an XPUB and a replay ROUTER on ipc://), what it published, and
    the index a subscriber builds from it."""

    pub: zmq.asyncio.Socket
    index: PrefixIndex
    log: list[bytes] = field(default_factory=lambda: [encode_batch(_batch(0))])
    sent: list[int] = field(default_factory=list)  # batches the replay socket had to send
    asks: list[int] = field(default_factory=list)  # the probes' start seqs

    async def subscribed(self) -> None:
        """The SUB's subscription has reached the publisher: nothing sent from here is lost."""
        assert (await asyncio.wait_for(self.pub.recv(), timeout=10.0))[:1] == b"\x01"

    async def publish(self, seq: int) -> None:
        self.log.append(encode_batch(_batch(seq)))
        await self.pub.send_multipart(encode_frame("", seq, _batch(seq)))


@asynccontextmanager
async def _replica(tmp_path: Path, probe_interval_s: float) -> AsyncIterator[Replica]:
    ctx = zmq.asyncio.Context()
    pub, router = ctx.socket(zmq.XPUB), ctx.socket(zmq.ROUTER)
    for s in (pub, router):
        s.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(f"ipc://{tmp_path}/r.pub")
    router.bind(f"ipc://{tmp_path}/r.replay")
    r = Replica(pub, PrefixIndex(1, stale_after_s=60.0))
    server = asyncio.create_task(_replay_server(router, r.log, r.sent, r.asks))
    feed = ReplicaFeed("r", f"ipc://{tmp_path}/r.pub", f"ipc://{tmp_path}/r.replay")
    sub = KvEventSubscriber(r.index, [feed], probe_interval_s=probe_interval_s)
    await sub.start()
    try:
        yield r
    finally:
        await sub.aclose()
        server.cancel()
        ctx.destroy(linger=0)


async def test_a_burst_is_applied_live_and_the_probe_replays_nothing(tmp_path: Path) -> None:
    async with _replica(tmp_path, probe_interval_s=0.05) as r:
        await _until(lambda: r.index.resync_from("r") == 1)  # the baseline, from the first probe
        await r.subscribed()
        r.sent.clear()
        burst = 2000
        for seq in range(1, burst + 1):
            await r.publish(seq)
        time.sleep(0.5)  # the loop is busy elsewhere: the whole burst queues in the SUB socket
        await _until(lambda: r.index.resync_from("r") == burst + 1)
        await asyncio.sleep(0.2)  # a few more probes
        assert r.sent == []  # every batch came live; each probe found nothing missing
        assert r.index.blocks_of("r") == burst  # each batch stored its block once


async def test_single_batches_are_applied_as_they_come_not_at_the_next_probe(
    tmp_path: Path,
) -> None:
    """ZMQ's descriptor is edge-triggered: a wake-up lost between reading the socket dry and
    waiting again would leave a batch queued until the next probe (30 s here)."""
    async with _replica(tmp_path, probe_interval_s=30.0) as r:
        await _until(lambda: r.index.resync_from("r") == 1)  # the first probe: the baseline
        await r.subscribed()
        for seq in range(1, 41):
            await r.publish(seq)
            if seq % 2:  # half of them while the subscriber's task is waiting, half at once
                await _until(lambda seq=seq: r.index.resync_from("r") == seq + 1, timeout=5.0)
        await _until(lambda: r.index.resync_from("r") == 41, timeout=5.0)
        assert r.sent == [0]  # only the baseline was replayed
        assert r.index.blocks_of("r") == 40


async def test_a_quiet_replica_is_probed_every_interval(tmp_path: Path) -> None:
    """No batch comes: only the probe's timer wakes the task, and it must keep doing so (the
    heartbeat that keeps a quiet replica known and finds a lost last batch)."""
    async with _replica(tmp_path, probe_interval_s=0.05) as r:
        await _until(lambda: len(r.asks) >= 10, timeout=10.0)
        assert r.sent == [0]  # the baseline once; the probes after it found nothing missing
