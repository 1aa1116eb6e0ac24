"""A minimal pipelined RESP connection for standalone Redis: the hot path's round trips.

redis-py spends more CPU packing a 30-argument EVALSHA than Redis spends running it; this packs
a whole batch into one bytes buffer and parses the replies with hiredis. Redis Cluster keeps using
redis-py's cluster pipeline (slot routing, MOVED handling).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import hiredis
from redis.asyncio.connection import parse_url

__all__ = ["RespConnection", "pack"]


def _arg(a: Any) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, float):
        return repr(a).encode()
    return b"%d" % a


def pack(commands: list[tuple[Any, ...]]) -> bytes:
    out = []
    for cmd in commands:
        out.append(b"*%d\r\n" % len(cmd))
        for a in cmd:
            b = _arg(a)
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class RespConnection:
    """One connection; ``execute`` sends a batch and returns its replies in order (error replies
    as ``hiredis.ReplyError`` values). Any I/O failure closes it; the next call reconnects."""

    def __init__(self, url: str, *, connect_timeout: float = 0.5) -> None:
        self._opts = parse_url(url)
        self._timeout = connect_timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> None:
        host = self._opts.get("host", "127.0.0.1")
        port = int(self._opts.get("port", 6379))
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), self._timeout
        )
        setup: list[tuple[Any, ...]] = []
        if self._opts.get("password"):
            user = self._opts.get("username")
            setup.append(
                ("AUTH", user, self._opts["password"]) if user else ("AUTH", self._opts["password"])
            )
        if int(self._opts.get("db", 0) or 0):
            setup.append(("SELECT", int(self._opts["db"])))
        if setup:
            for reply in await self._roundtrip(setup):
                if isinstance(reply, hiredis.ReplyError):
                    raise ConnectionError(f"redis setup failed: {reply}")

    async def _roundtrip(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(pack(commands))
        parser = hiredis.Reader()
        replies: list[Any] = []
        while len(replies) < len(commands):
            data = await self._reader.read(1 << 16)
            if not data:
                raise ConnectionError("connection closed by redis")
            parser.feed(data)
            reply = parser.gets()
            while reply is not False:
                replies.append(reply)
                reply = parser.gets()
        return replies

    async def execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        async with self._lock:
            try:
                if self._writer is None:
                    await self._connect()
                return await self._roundtrip(commands)
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
