"""A minimal gRPC-over-HTTP/2 (h2c) server for exactly one unary method: ShouldRateLimit.

Why: on small VMs grpc.aio spends ~0.2–0.3 ms of CPU per call in thread hand-offs and syscalls,
more than the decision itself. Envoy multiplexes many calls on one HTTP/2 connection; this server
reads them with one syscall, answers each from the event loop and writes all answers ready in the
same loop iteration with one syscall.

What it implements of RFC 9113 / gRPC: the connection preface, SETTINGS (and ACKs), PING ACKs,
WINDOW_UPDATE both ways (flow control on what it sends; generous windows on what it receives),
RST_STREAM, GOAWAY, HEADERS + CONTINUATION (request header blocks are not decoded: the server has
one method and never needs them, so the peer's HPACK dynamic table is irrelevant), padded DATA, and
length-prefixed gRPC messages (uncompressed; a compressed one is answered UNIMPLEMENTED). Answers
use HPACK static-table / literal-without-indexing encodings only. Anything else is a protocol
error: GOAWAY and close.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

__all__ = ["FrameReader", "H2Server", "read_frames"]

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONT = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIO = 0x1, 0x1, 0x4, 0x8, 0x20
RECV_WINDOW = 1 << 30
_Handler = Callable[[bytes], Awaitable[bytes]]


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return (
        bytes((n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, kind, flags))
        + struct.pack(">I", stream)
        + payload
    )


def _literal(name: bytes, value: bytes) -> bytes:
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


# :status 200 (static index 8); content-type (static name 31) = application/grpc
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + bytes((len(b"application/grpc"),)) + b"application/grpc"


def trailers(status: int, message: str = "") -> bytes:
    block = _literal(b"grpc-status", str(status).encode())
    if message:
        block += _literal(b"grpc-message", message.encode()[:120])
    return block


OK_TRAILERS = trailers(0)


def size_update(value: int) -> bytes:
    """HPACK dynamic table size update (RFC 7541 §6.3): owed after the peer lowers its table."""
    if value < 31:
        return bytes((0x20 | value,))
    out, value = [0x3F], value - 31
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class FrameReader(Protocol):
    """What :func:`read_frames` needs from a connection (both HTTP/2 servers have it)."""

    buf: bytearray
    preface: bool
    closed: bool
    consumed: int
    out: list[bytes]

    def _error(self, why: str) -> None: ...
    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None: ...
    def _schedule(self) -> None: ...


def read_frames(conn: FrameReader, data: bytes, window: int = RECV_WINDOW) -> None:
    """The reading half shared by the HTTP/2 servers (this one and the filter server's): buffer
    ``data``, check the client preface once, hand every whole frame to ``conn._on_frame``, then
    top up the connection's receive ``window`` once a quarter of it is used."""
    buf = conn.buf
    buf += data
    if not conn.preface:
        if len(buf) < len(PREFACE):
            return
        if bytes(buf[: len(PREFACE)]) != PREFACE:
            return conn._error("bad connection preface")
        del buf[: len(PREFACE)]
        conn.preface = True
    pos, end = 0, len(buf)
    while end - pos >= 9 and not conn.closed:
        length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
        if end - pos < 9 + length:
            break
        kind, flags = buf[pos + 3], buf[pos + 4]
        stream = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        payload = bytes(buf[pos + 9 : pos + 9 + length])
        pos += 9 + length
        conn._on_frame(kind, flags, stream, payload)
    del buf[:pos]
    if conn.consumed > window // 4:
        conn.out.append(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", conn.consumed)))
        conn.consumed = 0
        conn._schedule()


class _Conn(asyncio.Protocol):
    def __init__(self, server: H2Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.preface = False
        self.streams: dict[int, bytearray] = {}
        self.cont_stream = 0  # a header block continues on this stream
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.send_window = 65535
        self.peer_initial = 65535
        self.stream_windows: dict[int, int] = {}
        self.blocked: list[tuple[int, bytes]] = []  # (stream, message) waiting for window
        self.consumed = 0
        self.closed = False
        self.table_update: bytes = b""  # prefixed to our next header block

    # -- connection ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.server.conns.add(self)
        settings = struct.pack(">HI", 3, 10_000) + struct.pack(">HI", 4, RECV_WINDOW)
        self.out.append(_frame(SETTINGS, 0, 0, settings))
        self.out.append(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", RECV_WINDOW - 65535)))
        self._schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.conns.discard(self)

    def _error(self, why: str) -> None:
        log.warning("http/2 protocol error from peer: %s", why)
        self.out.append(_frame(GOAWAY, 0, 0, struct.pack(">II", 0, 1)))
        self._flush()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    # -- reading ---------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        read_frames(self, data)

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self.cont_stream and kind != CONT:
            return self._error("expected CONTINUATION")
        if kind == DATA:
            self.consumed += len(payload)
            body = self.streams.get(stream)
            if body is None:
                return  # reset or unknown stream: drop
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            body += payload
            if flags & END_STREAM:
                self._dispatch(stream, self.streams.pop(stream))
        elif kind == HEADERS:
            if stream in self.streams or stream == 0:
                return  # trailers from a client: unary requests have none that matter
            self.streams[stream] = bytearray()
            self.stream_windows[stream] = self.peer_initial
            if not flags & END_HEADERS:
                self.cont_stream = stream
            if flags & END_STREAM:
                self._dispatch(stream, self.streams.pop(stream))
        elif kind == CONT:
            if stream != self.cont_stream:
                return self._error("CONTINUATION on another stream")
            if flags & END_HEADERS:
                self.cont_stream = 0
        elif kind == SETTINGS:
            if not flags & ACK:
                for i in range(0, len(payload) - 5, 6):
                    ident, value = struct.unpack_from(">HI", payload, i)
                    if ident == 1 and value < 4096:
                        self.table_update = size_update(value)
                    if ident == 4:
                        delta = value - self.peer_initial
                        self.peer_initial = value
                        for s in self.stream_windows:
                            self.stream_windows[s] += delta
                self.out.append(_frame(SETTINGS, ACK, 0))
                self._schedule()
        elif kind == PING:
            if not flags & ACK:
                self.out.append(_frame(PING, ACK, 0, payload))
                self._schedule()
        elif kind == WINDOW_UPDATE:
            inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.send_window += inc
            elif stream in self.stream_windows:
                self.stream_windows[stream] += inc
            if self.blocked:
                self._retry_blocked()
        elif kind == RST_STREAM:
            self.streams.pop(stream, None)
            self.stream_windows.pop(stream, None)
        elif kind == GOAWAY:
            self.server.loop.call_later(1.0, self._close)
        elif kind == PUSH_PROMISE:
            return self._error("PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- answering -------------------------------------------------------------------------
    def _dispatch(self, stream: int, body: bytearray) -> None:
        if len(body) < 5 or body[0] != 0:
            code = 12 if body and body[0] else 13
            return self._trailers_only(stream, trailers(code, "expected one uncompressed message"))
        n = int.from_bytes(body[1:5], "big")
        message = bytes(body[5 : 5 + n])
        task = self.server.loop.create_task(self._answer(stream, message))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _answer(self, stream: int, message: bytes) -> None:
        try:
            reply = await self.server.handler(message)
        except Exception:
            log.exception("handler failed")
            return self._trailers_only(stream, trailers(13, "internal error"))
        self._send(stream, b"\x00" + len(reply).to_bytes(4, "big") + reply)

    def _trailers_only(self, stream: int, block: bytes) -> None:
        self.stream_windows.pop(stream, None)
        self.out.append(_frame(HEADERS, END_HEADERS, stream, self._headers()))
        self.out.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream, block))
        self._schedule()

    def _send(self, stream: int, message: bytes) -> None:
        if self.closed or stream not in self.stream_windows:
            return
        n = len(message)
        if n > self.send_window or n > self.stream_windows[stream] or n > 16384:
            if n > 16384:
                return self._trailers_only(stream, trailers(8, "reply too large"))
            self.blocked.append((stream, message))
            return
        self.send_window -= n
        del self.stream_windows[stream]
        self.out.append(_frame(HEADERS, END_HEADERS, stream, self._headers()))
        self.out.append(_frame(DATA, 0, stream, message))
        self.out.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream, OK_TRAILERS))
        self._schedule()

    def _headers(self) -> bytes:
        block, self.table_update = self.table_update + RESPONSE_HEADERS, b""
        return block

    def _retry_blocked(self) -> None:
        blocked, self.blocked = self.blocked, []
        for stream, message in blocked:
            self._send(stream, message)

    def _schedule(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.server.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()


class H2Server:
    """``await start(host, port)`` … ``await aclose()``; ``handler(request bytes) -> reply bytes``."""

    def __init__(self, handler: _Handler) -> None:
        self.handler = handler
        self.conns: set[_Conn] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.loop = asyncio.get_event_loop()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _Conn(self), host, port, reuse_port=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def aclose(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._server.close()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=grace)
        for conn in list(self.conns):
            conn.out.append(_frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
            conn._flush()
            conn._close()
        if self._server is not None:
            await self._server.wait_closed()
