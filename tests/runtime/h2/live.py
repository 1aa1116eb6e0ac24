"""Live servers for the HTTP/2 tests: the two services' transports on 127.0.0.1, and a raw
client that writes frames and collects the answer (until a predicate holds or the server
closes). Only the public constructors are used, so these tests run against any version."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from filters.h2server import H2FilterServer
from ratelimit_service.h2server import H2Server
from tests.runtime.h2.wire import frames

__all__ = ["Answer", "exchange", "live_filters", "live_rls", "settings_of"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CLIENT_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
Frames = list[tuple[int, int, int, bytes]]


@contextlib.asynccontextmanager
async def live_rls(handler: Callable[[bytes], Awaitable[bytes]]) -> AsyncIterator[int]:
    server = H2Server(handler)
    port = await server.start("127.0.0.1", 0)
    try:
        yield port
    finally:
        await server.aclose(0.1)


@contextlib.asynccontextmanager
async def live_filters(servicer: Any) -> AsyncIterator[int]:
    server = H2FilterServer(servicer, "127.0.0.1", 0)
    await server.start()
    try:
        yield server.port
    finally:
        await server.aclose(0.1)


class Answer:
    def __init__(self, data: bytes, closed: bool) -> None:
        self.frames: Frames = frames(data)
        self.closed = closed

    def goaway(self) -> tuple[int, int] | None:
        """(last stream id, error code) of the server's GOAWAY, if one came."""
        for kind, _, _, p in self.frames:
            if kind == 7:
                return struct.unpack(">II", p[:8])  # type: ignore[return-value]
        return None

    def resets(self) -> dict[int, int]:
        return {s: struct.unpack(">I", p)[0] for k, _, s, p in self.frames if k == 3}


def settings_of(answer: Answer) -> dict[int, int]:
    kind, flags, _, p = answer.frames[0]
    assert kind == 4 and not flags & 1
    return dict(struct.unpack_from(">HI", p, i) for i in range(0, len(p), 6))  # type: ignore[misc]


async def exchange(
    port: int,
    data: bytes,
    until: Callable[[Frames], bool] = lambda fs: False,
    *,
    wait: float = 15.0,
    preface: bool = True,
) -> Answer:
    """Send ``data`` (after the preface and an empty SETTINGS), read until ``until(frames)``,
    the server closes, or ``wait`` seconds pass (a bound, never an assertion)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got, closed = bytearray(), False
    try:
        writer.write((PREFACE + CLIENT_SETTINGS if preface else b"") + data)
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        while not until(frames(_whole(got))):
            left = end - loop.time()
            if left <= 0:
                break
            try:
                chunk = await asyncio.wait_for(reader.read(1 << 16), left)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return Answer(_whole(got), closed)


def _whole(data: bytearray) -> bytes:
    """The complete frames at the start of ``data``."""
    pos = 0
    while len(data) - pos >= 9:
        n = int.from_bytes(data[pos : pos + 3], "big")
        if len(data) - pos < 9 + n:
            break
        pos += 9 + n
    return bytes(data[:pos])
