"""A minimal pipelined RESP connection for standalone Redis: the hot path's round trips.

redis-py spends more CPU packing a 30-argument EVALSHA than Redis spends running it; this packs
a whole batch into one bytes buffer and parses the replies with hiredis. ``redis://`` and
``rediss://`` (TLS: the URL's ``ssl_ca_certs``, ``ssl_certfile``/``ssl_keyfile``,
``ssl_check_hostname`` and ``ssl_cert_reqs`` as redis-py reads them) over TCP take this path
(:func:`fast_path_url`); ``unix://`` and Redis Cluster keep using redis-py. The URL's ACL user
and password are sent with ``AUTH`` on each new connection. A round trip that gets no answer within ``read_timeout`` closes the
connection (the next call reconnects), and TCP keepalive finds a dead peer on an idle one, so a
stalled Redis costs the documented Redis-down behaviour, never a pinned pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Mapping
from typing import TypeAlias
from urllib.parse import urlsplit

import hiredis
from redis.asyncio.connection import ConnectKwargs, parse_url

__all__ = ["RespArg", "RespCommand", "RespConnection", "RespReply", "fast_path_url", "pack"]

RespArg: TypeAlias = bytes | str | int | float
RespCommand: TypeAlias = tuple[RespArg, ...]
# what a reply decodes to: hiredis gives bytes, integers, None, nested arrays and error replies as
# ``hiredis.ReplyError`` values; redis-py (the cluster and unix:// path) may also give str, float
# and, through its response callbacks, a dict (HGETALL)
RespReply: TypeAlias = (
    "bytes | str | int | float | Exception | list[RespReply] | dict[RespReply, RespReply] | None"
)


def _arg(a: RespArg) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, float):
        return repr(a).encode()
    return b"%d" % a


def pack(commands: list[RespCommand]) -> bytes:
    out = []
    for cmd in commands:
        out.append(b"*%d\r\n" % len(cmd))
        for a in cmd:
            b = _arg(a)
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def fast_path_url(url: str | None) -> str | None:
    """``url`` when the fast path may serve it (``redis://`` without its query, ``rediss://``
    with it: the TLS settings); None for ``unix://`` and the rest."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return None
    return url if parts.scheme == "rediss" else url.partition("?")[0]


def _text(opts: Mapping[str, object], key: str) -> str | None:
    """A URL query setting kept as text by ``parse_url`` (None when absent)."""
    value = opts.get(key)
    return value if isinstance(value, str) else None


def _tls_context(opts: Mapping[str, object]) -> ssl.SSLContext | None:
    """The client TLS context a ``rediss://`` URL asks for (None for ``redis://``)."""
    if _scheme(opts) != "rediss":
        return None
    ctx = ssl.create_default_context(cafile=_text(opts, "ssl_ca_certs"))
    reqs = _text(opts, "ssl_cert_reqs")
    if reqs in ("none", "optional"):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE if reqs == "none" else ssl.CERT_OPTIONAL
    elif opts.get("ssl_check_hostname") is False:
        ctx.check_hostname = False
    if certfile := _text(opts, "ssl_certfile"):
        ctx.load_cert_chain(certfile, _text(opts, "ssl_keyfile"))
    return ctx


def _scheme(opts: Mapping[str, object]) -> str:
    return "rediss" if "SSL" in getattr(opts.get("connection_class"), "__name__", "") else "redis"


_KEEPALIVE = (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3))


class RespConnection:
    """One connection; ``execute`` sends a batch and returns its replies in order (error replies
    as ``hiredis.ReplyError`` values). An I/O failure or a round trip longer than
    ``read_timeout`` closes it; the next call reconnects."""

    def __init__(
        self, url: str, *, connect_timeout: float = 0.5, read_timeout: float = 1.0
    ) -> None:
        if fast_path_url(url) is None:
            raise ValueError(f"the RESP fast path serves redis:// and rediss:// only, not {url}")
        self._opts: ConnectKwargs = parse_url(url)
        self._tls = _tls_context(self._opts)
        self._timeout = connect_timeout
        self._read_timeout = read_timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._stalled = False

    async def _connect(self) -> None:
        host = self._opts.get("host", "127.0.0.1")
        port = int(self._opts.get("port", 6379))
        hostname = host if self._tls is not None else None  # checked against the certificate
        self._reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=self._tls, server_hostname=hostname),
            self._timeout,
        )
        self._writer = writer
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in _KEEPALIVE:
                if hasattr(socket, name):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        setup: list[RespCommand] = []
        if self._opts.get("password"):
            user = self._opts.get("username")
            password = self._opts["password"]
            setup.append(("AUTH", user, password) if user else ("AUTH", password))
        if db := int(self._opts.get("db", 0) or 0):
            setup.append(("SELECT", db))
        if setup:
            for reply in await self._roundtrip(setup):
                if isinstance(reply, hiredis.ReplyError):
                    raise ConnectionError(f"redis setup failed: {reply}")

    async def _roundtrip(self, commands: list[RespCommand]) -> list[RespReply]:
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        writer.write(pack(commands))
        parser = hiredis.Reader()
        replies: list[RespReply] = []
        self._stalled = False
        timer = asyncio.get_running_loop().call_later(self._read_timeout, self._stall, writer)
        try:
            while len(replies) < len(commands):
                data = await reader.read(1 << 16)
                if not data:
                    if self._stalled:
                        raise TimeoutError(f"redis did not answer within {self._read_timeout}s")
                    raise ConnectionError("connection closed by redis")
                parser.feed(data)
                reply = parser.gets()
                while reply is not False:
                    replies.append(reply)
                    reply = parser.gets()
        finally:
            timer.cancel()
        return replies

    def _stall(self, writer: asyncio.StreamWriter) -> None:
        """No answer in time: drop the connection (a pending read ends with EOF)."""
        self._stalled = True
        writer.transport.abort()

    async def execute(self, commands: list[RespCommand]) -> list[RespReply]:
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
