"""A lean gRPC load client: unary calls pipelined on one HTTP/2 connection (asyncio protocol).

The rate-limit benchmark needs a client that costs less CPU per call than the service it
measures: on this 2-core machine the grpc.aio client (~80–300 µs of CPU per call) shares the
cores with the service and sets the ceiling (docs/benchmarks.md). Envoy, the real client, is
C++. This one writes pre-encoded frames (request headers as HPACK literals without indexing,
RFC 7541 §6.2.2, so no encoder state) and reads answers frame by frame; it keeps the HTTP/2
rules a server may hold it to: the connection and stream send windows (RFC 9113 §6.9), SETTINGS
and PING acknowledged, the peer's MAX_CONCURRENT_STREAMS (calls beyond it wait), GOAWAY and
RST_STREAM fail the calls they end, except REFUSED_STREAM (not processed: sent again, with
the number of open streams as the new limit until the peer's SETTINGS says otherwise). Response headers and trailers are decoded with the ``hpack``
package unless they are byte for byte the block already decoded (a server answers every OK call
alike), so a peer using its dynamic table is still read right.

A benchmark tool, not a transport: no TLS, no server push, no client-side deadline, a request
message in one DATA frame (≤ 16 KiB). ``tests/bench/test_h2_grpc_client.py`` runs it against
grpcio's server.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import cast

from hpack import Decoder

__all__ = ["GrpcError", "H2GrpcClient"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONT = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIO = 0x1, 0x1, 0x4, 0x8, 0x20
_HEAD = struct.Struct(">IBI")  # length << 8 | type, flags, stream id
_MAX_WINDOW = (1 << 31) - 1
_INITIAL_WINDOW = 65_535
_REFUSED_STREAM = 7
MAX_MESSAGE = 16_384 - 5  # one DATA frame within the default SETTINGS_MAX_FRAME_SIZE


class GrpcError(Exception):
    """A call that did not end with grpc-status 0 (or a connection that ended it)."""


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream) + payload


def _literal(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    assert len(n) < 127 and len(v) < 127
    return b"\x00" + bytes((len(n),)) + n + bytes((len(v),)) + v


@dataclass
class _Call:
    future: asyncio.Future[bytes]
    request: bytes  # the length-prefixed message (sent again when the stream is refused)
    body: bytearray = field(default_factory=bytearray)
    block: bytearray = field(default_factory=bytearray)  # a header block across CONTINUATION
    status: str | None = None


class H2GrpcClient(asyncio.Protocol):
    """``await call(message)`` → the answer message (bytes); raises :class:`GrpcError`."""

    def __init__(self, authority: str, path: str) -> None:
        self._headers = b"".join(
            _literal(k, v)
            for k, v in (
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            )
        )
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._next_id = 1
        self._calls: dict[int, _Call] = {}
        self._waiting: deque[tuple[bytes, asyncio.Future[bytes]]] = deque()
        self._send_window = _INITIAL_WINDOW  # connection
        self._stream_window = _INITIAL_WINDOW  # each new stream's, from the peer's SETTINGS
        self._max_streams = 100  # until the peer says (RFC 9113 §6.5.2: no limit by default)
        self._received = 0  # DATA bytes not yet returned to the peer's connection window
        self._decoder = Decoder()
        self._known: dict[bytes, str | None] = {}  # header block → its grpc-status
        # created here: with uvloop, create_connection may return before connection_made
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed: Exception | None = None
        self._continuing: int | None = None  # stream whose header block continues
        self.refused = 0  # streams the server refused (sent again)

    @classmethod
    async def connect(cls, host: str, port: int, path: str) -> H2GrpcClient:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: cls(f"{host}:{port}", path), host, port)
        await asyncio.wait_for(proto._ready, 10)
        return proto

    # ---- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        # no push; large stream windows (the answers are small: this is about not stalling)
        settings = struct.pack(">HIHI", 2, 0, 4, 1 << 24)
        self._transport.write(
            PREFACE
            + _frame(SETTINGS, 0, 0, settings)
            + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 30) - _INITIAL_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(exc or ConnectionError("connection closed"))

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 9:
            head, flags, stream = _HEAD.unpack_from(buf, pos)
            length, kind = head >> 8, head & 0xFF
            if end - pos - 9 < length:
                break
            payload = bytes(buf[pos + 9 : pos + 9 + length])
            pos += 9 + length
            self._frame(kind, flags, stream & 0x7FFFFFFF, payload)
        del buf[:pos]
        if self._received >= 1 << 20:  # give the connection window back in large steps
            self._write(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
            self._received = 0

    # ---- calls ---------------------------------------------------------------------------
    async def call(self, message: bytes) -> bytes:
        if len(message) > MAX_MESSAGE:
            raise ValueError(f"{len(message)} bytes: this client sends at most {MAX_MESSAGE}")
        if self._closed is not None:
            raise GrpcError(f"connection closed: {self._closed}")
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting.append((b"\x00" + struct.pack(">I", len(message)) + message, fut))
        self._send()
        return await fut

    def _send(self) -> None:
        while self._waiting and len(self._calls) < self._max_streams:
            body, fut = self._waiting[0]
            if len(body) > self._send_window or len(body) > self._stream_window:
                return  # wait for WINDOW_UPDATE
            self._waiting.popleft()
            if fut.done():
                continue
            sid = self._next_id
            self._next_id += 2
            self._send_window -= len(body)
            self._calls[sid] = _Call(fut, body)
            self._write(
                _frame(HEADERS, END_HEADERS, sid, self._headers)
                + _frame(DATA, END_STREAM, sid, body)
            )

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- frames --------------------------------------------------------------------------
    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == DATA:
            self._received += len(payload)
            call = self._calls.get(stream)
            if call is not None:
                call.body += _unpad(flags, payload)
            if flags & END_STREAM:
                self._end(stream, None)
        elif kind in (HEADERS, CONT):
            if kind == HEADERS:
                payload = _unpad(flags, payload)
                if flags & PRIO:
                    payload = payload[5:]
                self._continuing = stream
                if stream in self._calls:
                    self._calls[stream].block = bytearray()
            call = self._calls.get(stream)
            if call is not None:
                call.block += payload
            if flags & END_HEADERS:
                self._continuing = None
                status = self._status(bytes(call.block)) if call is not None else None
                if call is not None and status is not None:
                    call.status = status
            if kind == HEADERS and flags & END_STREAM:
                self._end(stream, None)
        elif kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                key, value = struct.unpack_from(">HI", payload, i)
                if key == 3:
                    self._max_streams = value
                elif key == 4:
                    self._stream_window = value
            self._write(_frame(SETTINGS, ACK, 0))
            if not self._ready.done():
                self._ready.set_result(None)
            self._send()
        elif kind == PING and not flags & ACK:
            self._write(_frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE and stream == 0:
            self._send_window = min(_MAX_WINDOW, self._send_window + (_u32(payload) & _MAX_WINDOW))
            self._send()
        elif kind == RST_STREAM and _u32(payload) == _REFUSED_STREAM and stream in self._calls:
            # not processed (RFC 9113 §8.7): send it again once a stream is free
            call = self._calls.pop(stream)
            self._waiting.appendleft((call.request, call.future))
            self._max_streams = max(1, len(self._calls))
            self.refused += 1
            self._send()
        elif kind == RST_STREAM:
            self._end(stream, GrpcError(f"stream reset, code {_u32(payload)}"))
        elif kind == GOAWAY:
            last = _u32(payload) & _MAX_WINDOW
            for sid in [s for s in self._calls if s > last]:
                self._end(sid, GrpcError("GOAWAY: not processed"))
            self._closed = GrpcError("GOAWAY")

    def _status(self, block: bytes) -> str | None:
        """The block's grpc-status (None: it has none), decoded once per distinct block."""
        if block in self._known:
            return self._known[block]
        status = None
        for name, value in self._decoder.decode(block):
            key = name.decode() if isinstance(name, bytes) else name
            if key == "grpc-status":
                status = value.decode() if isinstance(value, bytes) else str(value)
        if len(self._known) < 64 and self._decoder.header_table.dynamic_entries == deque():
            self._known[block] = status  # no dynamic table state: the same bytes mean the same
        return status

    def _end(self, stream: int, error: Exception | None) -> None:
        call = self._calls.pop(stream, None)
        if call is None:
            return
        if not call.future.done():
            if error is not None:
                call.future.set_exception(error)
            elif call.status != "0":
                call.future.set_exception(GrpcError(f"grpc-status {call.status}"))
            elif len(call.body) < 5:
                call.future.set_exception(GrpcError("no message"))
            else:
                call.future.set_result(bytes(call.body[5:]))
        self._send()

    def _fail_all(self, exc: Exception) -> None:
        self._closed = exc
        for sid in list(self._calls):
            self._end(sid, GrpcError(str(exc)))
        while self._waiting:
            _, fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(GrpcError(str(exc)))
        if not self._ready.done():
            self._ready.set_exception(GrpcError(str(exc)))


def _u32(payload: bytes) -> int:
    return int(struct.unpack_from(">I", payload)[0])


def _unpad(flags: int, payload: bytes) -> bytes:
    if flags & PADDED:
        pad = payload[0]
        return payload[1 : len(payload) - pad]
    return payload
