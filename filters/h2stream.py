"""One ext_proc stream of the HTTP/2 transport (:mod:`filters.h2server`): the subset of a
grpc.aio servicer context that ``FilterServicer.Process`` uses — ``read``, ``write`` and
``invocation_metadata`` — backed by the connection's frame handling."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

if TYPE_CHECKING:
    from filters.h2server import _Conn

__all__ = ["EOF", "StreamContext"]

EOF = grpc.aio.EOF  # type: ignore[attr-defined]


class StreamContext:
    """One ext_proc stream: the grpc.aio-context subset ``FilterServicer.Process`` uses."""

    def __init__(self, conn: _Conn, sid: int, metadata: list[tuple[str, str]]) -> None:
        self.conn = conn
        self.id = sid
        self.metadata = metadata
        self.buf = bytearray()
        self.inbox: deque[pb.ProcessingRequest] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.send_window = conn.peer_initial
        self.consumed = 0
        self.headers_sent = False
        self.remote_closed = False
        self.reset = False
        self.task: asyncio.Task[None] | None = None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    async def read(self) -> Any:
        while not self.inbox:
            if self.remote_closed:
                return EOF
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return self.inbox.popleft()

    async def write(self, message: pb.ProcessingResponse) -> None:
        data = message.SerializeToString()
        await self.conn.send(self, b"\x00" + len(data).to_bytes(4, "big") + data)

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
