"""One gRPC call on an HTTP/2 connection (:mod:`runtime.h2.connection`): the messages the peer
sent (``read``), the messages we send (``write``) and the request's metadata.

Receive-side flow control lives here: the bytes of a stream are returned to the peer (a stream
WINDOW_UPDATE) only while the application has no unread message on it, so a method that stops
reading stops its peer after one window (backpressure) instead of buffering without bound."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from runtime.h2.frames import Limits

__all__ = ["Method", "Stream", "StreamOwner"]


class StreamOwner(Protocol):
    """What a stream needs of its connection (:class:`~runtime.h2.connection.H2Connection`),
    named here so that this module imports nothing of the connection's."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def peer_initial(self) -> int: ...

    def consumed(self, s: Stream, n: int) -> None: ...
    async def send(self, s: Stream, data: bytes) -> None: ...


class Stream:
    """What a method sees of its call: ``read()``, ``write()``, ``invocation_metadata()``."""

    __slots__ = (
        "buf",
        "closed",
        "conn",
        "credit",
        "headers_sent",
        "id",
        "inbox",
        "inbox_bytes",
        "metadata",
        "method",
        "path",
        "recv_window",
        "remote_closed",
        "send_window",
        "task",
        "timeout",
        "timer",
        "waiter",
    )

    def __init__(
        self,
        conn: StreamOwner,
        sid: int,
        path: str,
        metadata: tuple[tuple[str, str], ...],
        timeout: float | None,
    ) -> None:
        self.conn = conn
        self.id = sid
        self.path = path
        self.metadata = metadata
        self.timeout = timeout
        self.buf = bytearray()  # a message still arriving
        self.inbox: deque[bytes] = deque()  # whole messages the method has not read yet
        self.inbox_bytes = 0
        self.waiter: asyncio.Future[None] | None = None
        self.send_window = conn.peer_initial
        self.recv_window = conn.limits.stream_window  # what the peer may still send
        self.credit = 0  # received bytes not yet returned to the peer
        self.headers_sent = False
        self.remote_closed = False
        self.closed = False  # answered or reset: nothing more is sent
        self.method: Method | None = None  # set while a unary call waits for its request
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def read(self) -> bytes | None:
        """The next request message, or None once the peer has finished sending."""
        while not self.inbox:
            if self.remote_closed or self.closed:
                return None
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return self.take()

    def take(self) -> bytes:
        msg = self.inbox.popleft()
        self.inbox_bytes -= len(msg)
        self.conn.consumed(self, len(msg))
        return msg

    async def write(self, message: bytes) -> None:
        """Send one message (waits for the peer's flow-control windows)."""
        await self.conn.send(self, b"\x00" + len(message).to_bytes(4, "big") + message)

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


Unary = Callable[[bytes], Awaitable[bytes]]
UnaryWithMetadata = Callable[[bytes, tuple[tuple[str, str], ...]], Awaitable[bytes]]
Streaming = Callable[[Stream], Awaitable[None]]


@dataclass(frozen=True)
class Method:
    """A unary method (request bytes → reply bytes; ``unary_metadata`` also gets the call's
    metadata, e.g. ``traceparent``) or a streaming one (given the call)."""

    unary: Unary | None = None
    streaming: Streaming | None = None
    unary_metadata: UnaryWithMetadata | None = None
