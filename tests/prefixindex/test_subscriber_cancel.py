"""The KV-event subscriber stops when cancelled, even when a replay answer arrives at the same
moment as the cancel (Python 3.11's ``asyncio.wait_for`` dropped such a cancel: the follower
task went on forever and the filter server's shutdown waited on it)."""

from __future__ import annotations

import asyncio

import pytest

from prefixindex.index import PrefixIndex
from prefixindex.subscriber import KvEventSubscriber, ReplicaFeed
from prefixindex.wire import END_SEQ, encode_seq


class _Dealer:
    """Answers the replay request with its end, cancelling ``victim`` as the answer comes."""

    def __init__(self) -> None:
        self.victim: asyncio.Task[None] | None = None
        self.closed = False

    def setsockopt(self, *_: object) -> None:
        pass

    def connect(self, _: str) -> None:
        pass

    async def send_multipart(self, _: list[bytes]) -> None:
        pass

    async def recv_multipart(self) -> list[bytes]:
        assert self.victim is not None
        self.victim.cancel()  # the cancel arrives as the answer completes
        return [b"", encode_seq(END_SEQ), b""]

    def close(self, linger: int = 0) -> None:
        self.closed = True


class _Ctx:
    def __init__(self, dealer: _Dealer) -> None:
        self.dealer = dealer

    def socket(self, _: int) -> _Dealer:
        return self.dealer


async def test_a_cancel_that_meets_a_replay_answer_is_not_lost() -> None:
    index = PrefixIndex(16)
    feed = ReplicaFeed("r1", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    sub = KvEventSubscriber(index, [feed])
    dealer = _Dealer()
    sub._ctx = _Ctx(dealer)  # type: ignore[assignment]
    index.add_replica(feed.name)
    task = asyncio.create_task(sub._replay(feed))
    dealer.victim = task
    with pytest.raises(asyncio.CancelledError):
        await task
    assert dealer.closed
