"""An HTTP/2 (h2c) transport for the ext_proc ``Process`` bidi stream, without grpc.aio.

Why: grpc.aio costs ~0.5 ms of CPU per ext_proc stream (thread hand-offs, per-message syscalls),
half of the filter server's budget. Envoy multiplexes every stream on a few HTTP/2 connections;
this server reads them with one syscall, runs each stream's :meth:`FilterServicer.Process` as a
task on the event loop and writes everything produced in one loop iteration with one syscall.

Each stream gets a :class:`StreamContext` offering what ``Process`` uses of a grpc.aio context:
``read()`` (returns ``grpc.aio.EOF`` at the client's end of stream), ``write(message)`` and
``invocation_metadata()`` (the request's non-pseudo headers, HPACK-decoded with the ``hpack``
package so Envoy's Huffman strings and dynamic table work). Framing shared with the rate-limit
service's unary server (``ratelimit_service.h2server``): SETTINGS/PING/GOAWAY, header blocks
over CONTINUATION, padded DATA, gRPC length-prefixed messages spanning DATA frames (several per
stream both ways), flow control both ways (large receive windows replenished per stream and per
connection; what we send waits for the peer's windows), RST_STREAM from the peer (the stream's
task is cancelled and its state freed), trailers with grpc-status (13 when ``Process`` raises, 12
for a compressed message or another method). Anything malformed on the connection: GOAWAY, close.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any, cast

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hpack import Decoder
from hpack.exceptions import HPACKError

from filters.h2stream import EOF, StreamContext
from filters.server import FilterServicer
from ratelimit_service.h2server import (
    ACK,
    CONT,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PRIO,
    PUSH_PROMISE,
    RECV_WINDOW,
    RESPONSE_HEADERS,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    read_frames,
    size_update,
    trailers,
)
from ratelimit_service.h2server import _frame as frame

__all__ = ["EOF", "PROCESS_PATH", "H2FilterServer", "StreamContext"]

_log = logging.getLogger(__name__)

PROCESS_PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
MAX_FRAME = 16384
MAX_STREAMS = 100_000
OK_TRAILERS = trailers(0)


_HCACHE_MAX = 64  # distinct stream-opening header blocks remembered per connection


def _same_table(a: tuple[int, Any, int], b: tuple[int, Any, int]) -> bool:
    """The same dynamic table: an insert always puts a new tuple first (identity, not equality)."""
    return a[0] == b[0] and a[1] is b[1] and a[2] == b[2]


class _Conn(asyncio.Protocol):
    def __init__(self, server: H2FilterServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.preface = False
        self.decoder = Decoder()
        self.streams: dict[int, StreamContext] = {}
        self.last_stream = 0
        self.block: tuple[int, int, bytearray] | None = None  # (stream, flags, fragments)
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.send_window = 65535
        self.peer_initial = 65535
        self.window_waiters: list[asyncio.Future[None]] = []
        self.consumed = 0
        self.closed = False
        self.goaway = False
        self.table_update = b""  # prefixed to our next header block
        self.hcache: dict[bytes, tuple[tuple[tuple[str, str], ...], str]] = {}
        self.hstate: tuple[int, Any, int] = (-1, None, -1)  # the table state hcache is valid for

    # -- connection ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.server.conns.add(self)
        settings = struct.pack(">HIHI", 3, MAX_STREAMS, 4, RECV_WINDOW)
        self.out.append(frame(SETTINGS, 0, 0, settings))
        self.out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", RECV_WINDOW - 65535)))
        self._schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.conns.discard(self)
        for s in list(self.streams.values()):
            self._drop(s)
        self._wake_writers()

    def _error(self, why: str) -> None:
        _log.warning("http/2 protocol error from peer: %s", why)
        self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream, 1)))
        self._flush()
        self.close()
        self.closed = True

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- reading ---------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        read_frames(self, data, RECV_WINDOW)

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self.block is not None and (kind != CONT or stream != self.block[0]):
            return self._error("expected CONTINUATION")
        if kind == DATA:
            self._on_data(flags, stream, payload)
        elif kind == HEADERS:
            if stream == 0:
                return self._error("HEADERS on stream 0")
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIO:
                payload = payload[5:]
            self.block = (stream, flags, bytearray(payload))
            if flags & END_HEADERS:
                self._on_header_block()
        elif kind == CONT:
            if self.block is None:
                return self._error("CONTINUATION without HEADERS")
            self.block[2].extend(payload)
            if flags & END_HEADERS:
                self._on_header_block()
        elif kind == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
        elif kind == PING:
            if not flags & ACK:
                self.out.append(frame(PING, ACK, 0, payload))
                self._schedule()
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                return self._error("bad WINDOW_UPDATE")
            inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.send_window += inc
            elif (s := self.streams.get(stream)) is not None:
                s.send_window += inc
            self._wake_writers()
        elif kind == RST_STREAM:
            if (s := self.streams.get(stream)) is not None:
                self._drop(s)
        elif kind == GOAWAY:
            self.goaway = True
            if not self.streams:
                self.close()
        elif kind == PUSH_PROMISE:
            return self._error("PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5)

    def _on_settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            ident, value = struct.unpack_from(">HI", payload, i)
            if ident == 1 and value < 4096:
                self.table_update = size_update(value)
            elif ident == 4:
                delta, self.peer_initial = value - self.peer_initial, value
                for s in self.streams.values():
                    s.send_window += delta
                self._wake_writers()
        self.out.append(frame(SETTINGS, ACK, 0))
        self._schedule()

    def _on_header_block(self) -> None:
        assert self.block is not None
        stream, flags, block = self.block
        self.block = None
        try:  # every block is decoded, even ignored ones: the dynamic table must stay in sync
            metadata, path = self._decode(bytes(block))
        except HPACKError as exc:
            return self._error(f"HPACK: {exc}")
        s = self.streams.get(stream)
        if s is not None or stream <= self.last_stream:  # trailers (or late ones after a reset)
            if s is not None and flags & END_STREAM:
                s.remote_closed = True
                s.wake()
            return
        self.last_stream = stream
        s = StreamContext(self, stream, list(metadata))
        s.remote_closed = bool(flags & END_STREAM)
        self.streams[stream] = s
        if path != PROCESS_PATH or self.goaway:
            return self._finish(s, trailers(12, f"unknown method {path}"[:100]))
        task = self.loop.create_task(self.server.servicer.Process(None, s))
        s.task = task
        self.server.tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(s, t))

    def _decode(self, block: bytes) -> tuple[tuple[tuple[str, str], ...], str]:
        """A header block's non-pseudo headers and ``:path``, through :attr:`hcache`.

        Envoy opens every ext_proc stream of a route with the same bytes (indexed fields and a
        non-indexed ``:path``), whose decoding (Huffman) is the costliest step per stream. A
        block that left the dynamic table as it was is cached; the cache holds only while the
        table stays in that state (same first entry object, length and size), so a hit decodes
        exactly as the decoder would."""
        table = self.decoder.header_table
        entries = table.dynamic_entries
        state = (len(entries), entries[0] if entries else None, table.maxsize)
        if not _same_table(state, self.hstate):
            self.hcache.clear()
            self.hstate = state
        hit = self.hcache.get(block)
        if hit is not None:
            return hit
        headers = self.decoder.decode(block)
        metadata = tuple((str(k), str(v)) for k, v in headers if not str(k).startswith(":"))
        result = metadata, next((str(v) for k, v in headers if k == ":path"), "")
        after = (len(entries), entries[0] if entries else None, table.maxsize)
        if not _same_table(after, state):
            self.hcache.clear()
            self.hstate = after
        elif len(self.hcache) < _HCACHE_MAX:
            self.hcache[block] = result
        return result

    def _on_data(self, flags: int, stream: int, payload: bytes) -> None:
        self.consumed += len(payload)
        s = self.streams.get(stream)
        if s is None or s.remote_closed:
            return  # reset, finished or unknown stream: drop (the connection window counts it)
        s.consumed += len(payload)
        if s.consumed > RECV_WINDOW // 4:
            self.out.append(frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", s.consumed)))
            s.consumed = 0
            self._schedule()
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        buf = s.buf
        buf += payload
        got = False
        while len(buf) >= 5:
            n = int.from_bytes(buf[1:5], "big")
            if len(buf) < 5 + n:
                break
            if buf[0] != 0:
                return self._finish(s, trailers(12, "compressed messages are not supported"))
            try:
                msg = pb.ProcessingRequest.FromString(bytes(buf[5 : 5 + n]))
            except Exception:  # protobuf's DecodeError
                return self._finish(s, trailers(13, "cannot parse ProcessingRequest"))
            del buf[: 5 + n]
            s.inbox.append(msg)
            got = True
        if flags & END_STREAM:
            s.remote_closed = True
            got = True
        if got:
            s.wake()

    # -- answering -------------------------------------------------------------------------
    async def send(self, s: StreamContext, message: bytes) -> None:
        if not s.headers_sent:
            s.headers_sent = True
            self.out.append(frame(HEADERS, END_HEADERS, s.id, self._headers()))
        view, pos = memoryview(message), 0
        while pos < len(message):
            if s.reset or self.closed:
                raise ConnectionResetError("the ext_proc stream was reset")
            n = min(len(message) - pos, MAX_FRAME, self.send_window, s.send_window)
            if n <= 0:
                self._schedule()
                fut = self.loop.create_future()
                self.window_waiters.append(fut)
                await fut
                continue
            self.send_window -= n
            s.send_window -= n
            self.out.append(frame(DATA, 0, s.id, bytes(view[pos : pos + n])))
            pos += n
        self._schedule()

    def _task_done(self, s: StreamContext, task: asyncio.Task[None]) -> None:
        self.server.tasks.discard(task)
        if s.reset or self.closed:
            return
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            _log.error("ext_proc stream failed", exc_info=exc)
        self._finish(s, OK_TRAILERS if exc is None else trailers(13, "internal error"))

    def _finish(self, s: StreamContext, block: bytes) -> None:
        """Trailers with END_STREAM; RST_STREAM(NO_ERROR) if the peer has not finished."""
        if not s.headers_sent:
            block = self._headers() + block  # trailers-only
        self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, s.id, block))
        if not s.remote_closed:
            self.out.append(frame(RST_STREAM, 0, s.id, b"\x00\x00\x00\x00"))
        self._drop(s)
        self._schedule()

    def _drop(self, s: StreamContext) -> None:
        """Free the stream's state; a task still running is cancelled (peer reset or gone)."""
        s.reset = True
        self.streams.pop(s.id, None)
        if s.task is not None and not s.task.done():
            s.task.cancel()
        if self.goaway and not self.streams:
            self.loop.call_soon(self.close)

    def _headers(self) -> bytes:
        block, self.table_update = self.table_update + RESPONSE_HEADERS, b""
        return block

    def _wake_writers(self) -> None:
        waiters, self.window_waiters = self.window_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _schedule(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()


class H2FilterServer:
    """Same interface as :class:`filters.server.FilterServer`: ``start()``, ``aclose()``."""

    def __init__(self, servicer: FilterServicer, host: str, port: int) -> None:
        self.servicer = servicer
        self.host = host
        self.port = port
        self.conns: set[_Conn] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_event_loop()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _Conn(self), self.host, self.port, reuse_port=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def aclose(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns):
            conn.goaway = True
            conn.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", conn.last_stream, 0)))
            conn._flush()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=grace)
        for conn in list(self.conns):
            conn._flush()
            conn.close()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=grace)
        if self._server is not None:
            await self._server.wait_closed()
