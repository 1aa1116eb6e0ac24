"""One server-side HTTP/2 connection (RFC 9113, h2c with prior knowledge) carrying gRPC calls.

Strict like a maintained server: SETTINGS are advertised and enforced (frame size, header list
size, concurrent streams → REFUSED_STREAM), header blocks over CONTINUATION are bounded, gRPC
messages are bounded (``Limits.max_message`` → RESOURCE_EXHAUSTED before the body is buffered),
receive windows are real (a stream's credit returns only as its method reads; overflow is
FLOW_CONTROL_ERROR), the transport pauses while ``Limits.max_buffered`` bytes wait unread or the
peer stops reading our answers, a rapid-reset guard answers a RST_STREAM flood with GOAWAY
ENHANCE_YOUR_CALM, and every malformed frame is a connection error (GOAWAY with the last stream
id processed and the RFC's code) or a stream error (RST_STREAM): nothing escapes to asyncio.
What the calls mean (methods, deadlines, health) belongs to :mod:`runtime.h2.server`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, cast

from hpack.exceptions import HPACKError, OversizedHeaderListError

from runtime.h2 import control
from runtime.h2 import frames as f
from runtime.h2.errors import ErrorCode, H2ConnectionError, H2StreamError
from runtime.h2.headers import HeaderDecoder
from runtime.h2.stream import Stream
from runtime.h2.writer import Writer

__all__ = ["H2Connection", "Host"]

log = logging.getLogger(__name__)

E = ErrorCode
_MAX_CONT = 64  # CONTINUATION frames per header block


class Host(Protocol):
    """What a connection needs from its server (:class:`runtime.h2.server.GrpcH2Server`)."""

    loop: asyncio.AbstractEventLoop
    limits: f.Limits
    clock: Callable[[], float]
    conns: set[H2Connection]

    def open(self, conn: H2Connection, s: Stream) -> None: ...
    def ready(self, conn: H2Connection, s: Stream) -> None: ...


class H2Connection(Writer, asyncio.Protocol):
    def __init__(self, host: Host) -> None:
        self.host = host
        self.loop = host.loop
        self.limits = lim = host.limits
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.preface = self.got_settings = False
        self.headers = HeaderDecoder(lim.max_header_list_size)
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0  # the highest stream id the peer opened
        self.block: tuple[int, int, bytearray] | None = None  # header block being received
        self.cont_frames = 0
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.send_window, self.peer_initial, self.peer_max_frame = 65535, 65535, 16384
        self.recv_window = lim.connection_window
        self.credit = 0
        self.window_waiters: list[asyncio.Future[None]] = []
        self.closed = self.draining = False
        self.table_update = b""  # prefixed to our next header block
        self.buffered = 0
        self.paused: set[str] = set()
        self.resets, self.reset_at = float(lim.reset_burst), host.clock()

    # -- connection ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.host.conns.add(self)
        self.out.append(f.frame(f.SETTINGS, 0, 0, self.limits.settings()))
        if self.recv_window > 65535:
            self.out.append(self._window_update(0, self.recv_window - 65535))
        self.schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.host.conns.discard(self)
        for s in list(self.streams.values()):
            self.drop(s)
        self.wake_writers()

    def fail(self, code: ErrorCode, why: str) -> None:
        """A connection error: GOAWAY(last stream processed, code), then close."""
        if self.closed:
            return
        log.warning("http/2 connection error %s: %s", code.name, why)
        self.out.append(f.goaway(self.last_stream, code, why.encode()[:64]))
        self.closed = True
        self.linger()
        for s in list(self.streams.values()):
            self.drop(s)

    def drain(self) -> None:
        """Graceful shutdown: GOAWAY(last stream, NO_ERROR); new streams are refused."""
        if not self.draining and not self.closed:
            self.draining = True
            self.out.append(f.goaway(self.last_stream, E.NO_ERROR))
            self._flush()
            if not self.streams:
                self.linger()

    def linger(self) -> None:
        """Flush, half-close, close a second later: a peer still sending gets what we wrote
        (our GOAWAY, the last trailers), not a TCP reset that would discard it."""
        self._flush()
        t = self.transport
        if t is not None and not t.is_closing() and t.can_write_eof():
            try:
                t.write_eof()
            except OSError:  # the peer is already gone
                return self.close()
            self.loop.call_later(1.0, self.close)
        else:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:  # the peer stopped reading: stop reading its requests
        self._pause("writing")

    def resume_writing(self) -> None:
        self._resume("writing")

    def _pause(self, why: str) -> None:
        if not self.paused and self.transport is not None:
            self.transport.pause_reading()
        self.paused.add(why)

    def _resume(self, why: str) -> None:
        if why in self.paused:
            self.paused.discard(why)
            if not self.paused and self.transport is not None and not self.closed:
                self.transport.resume_reading()

    # -- reading ---------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # after our GOAWAY: discarded until the lingering close ends
        try:
            self._read(data)
        except H2ConnectionError as exc:
            self.fail(exc.code, exc.why)
        except Exception:  # a bug here must cost one connection, never the server
            log.exception("http/2 connection failed")
            self.fail(E.INTERNAL_ERROR, "internal error")

    def _read(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.preface:
            if len(buf) < len(f.PREFACE):
                if not f.PREFACE.startswith(bytes(buf)):
                    raise H2ConnectionError(E.PROTOCOL_ERROR, "bad connection preface")
                return
            if bytes(buf[: len(f.PREFACE)]) != f.PREFACE:
                raise H2ConnectionError(E.PROTOCOL_ERROR, "bad connection preface")
            del buf[: len(f.PREFACE)]
            self.preface = True
        pos, end, max_frame = 0, len(buf), self.limits.max_frame_size
        try:
            while end - pos >= 9 and not self.closed:
                length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
                if length > max_frame:
                    raise H2ConnectionError(E.FRAME_SIZE_ERROR, f"frame of {length} bytes")
                if end - pos < 9 + length:
                    break
                kind, flags = buf[pos + 3], buf[pos + 4]
                stream = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                try:
                    self._on_frame(kind, flags, stream, payload)
                except H2StreamError as exc:
                    self.reset(exc.stream, exc.code, exc.why)
        finally:
            del buf[:pos]

    def _on_frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self.block is not None and kind != f.CONT:
            raise H2ConnectionError(E.PROTOCOL_ERROR, "expected CONTINUATION")
        if not self.got_settings:
            if kind != f.SETTINGS or flags & f.ACK:
                raise H2ConnectionError(E.PROTOCOL_ERROR, "the first frame must be SETTINGS")
            self.got_settings = True
        if kind == f.DATA:
            self._on_data(flags, stream, payload)
        elif kind == f.HEADERS:
            self._on_headers(flags, stream, payload)
        elif kind == f.CONT:
            self._on_continuation(flags, stream, payload)
        elif kind == f.WINDOW_UPDATE:
            control.on_window_update(self, stream, payload)
        elif kind == f.RST_STREAM:
            control.on_rst_stream(self, stream, payload)
        elif kind == f.SETTINGS:
            control.on_settings(self, flags, stream, payload)
        elif kind == f.PING:
            control.on_ping(self, flags, stream, payload)
        elif kind == f.PRIORITY:
            control.on_priority(stream, payload)
        elif kind == f.GOAWAY:
            control.on_goaway(self, stream, payload)
        elif kind == f.PUSH_PROMISE:
            raise H2ConnectionError(E.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # unknown frame types are ignored (RFC 9113 §5.5)

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & f.PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise H2ConnectionError(E.PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1 : len(payload) - payload[0]]

    def _on_data(self, flags: int, stream: int, payload: bytes) -> None:
        if not stream:
            raise H2ConnectionError(E.PROTOCOL_ERROR, "DATA on stream 0")
        n = len(payload)
        if n > self.recv_window:
            raise H2ConnectionError(E.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self.recv_window -= n
        self.credit += n  # the connection's credit returns at once: streams hold backpressure
        if self.credit >= self.limits.connection_window >> 2:
            self.out.append(self._window_update(0, self.credit))
            self.recv_window += self.credit
            self.credit = 0
            self.schedule()
        data = self._unpad(flags, payload)
        s = self.streams.get(stream)
        if s is None:
            if stream > self.last_stream:
                raise H2ConnectionError(E.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we answered or reset: ignored (RFC 9113 §5.1)
        if s.remote_closed:
            raise H2StreamError(stream, E.STREAM_CLOSED, "DATA after END_STREAM")
        if n > s.recv_window:
            raise H2StreamError(stream, E.FLOW_CONTROL_ERROR, "DATA beyond the stream window")
        s.recv_window -= n
        s.credit += n
        if data:
            self._messages(s, data)
        if flags & f.END_STREAM and not s.closed:
            s.remote_closed = True
            if s.method is not None:  # a unary call waiting for its request
                self.host.ready(self, s)
        s.wake()
        if not s.inbox and s.credit >= self.limits.stream_window >> 2 and not s.closed:
            self._return_credit(s)

    def _messages(self, s: Stream, data: bytes) -> None:
        """Split gRPC length-prefixed messages; a too large or compressed one ends the call."""
        buf = s.buf
        buf += data
        limit = self.limits.max_message
        while len(buf) >= 5:
            n = int.from_bytes(buf[1:5], "big")
            if buf[0] != 0:
                return self.host_finish(s, 12, "compressed messages are not supported")
            if n > limit:
                return self.host_finish(s, 8, f"message of {n} bytes exceeds {limit}")
            if len(buf) < 5 + n:
                break
            msg = bytes(buf[5 : 5 + n])
            del buf[: 5 + n]
            s.inbox.append(msg)
            s.inbox_bytes += n
            self.buffered += n
        if self.buffered > self.limits.max_buffered:
            self._pause("buffered")

    def consumed(self, s: Stream, n: int) -> None:
        """The method read ``n`` bytes of ``s``: give the stream's credit back once caught up."""
        self.buffered -= n
        if "buffered" in self.paused and self.buffered <= self.limits.max_buffered >> 1:
            self._resume("buffered")
        if not s.inbox and s.credit >= self.limits.stream_window >> 2 and not s.closed:
            self._return_credit(s)

    def _return_credit(self, s: Stream) -> None:
        if not s.remote_closed:
            self.out.append(self._window_update(s.id, s.credit))
            s.recv_window += s.credit
            self.schedule()
        s.credit = 0

    def _on_headers(self, flags: int, stream: int, payload: bytes) -> None:
        if not stream or not stream & 1:
            raise H2ConnectionError(E.PROTOCOL_ERROR, f"HEADERS on stream {stream}")
        payload = self._unpad(flags, payload)
        if flags & f.PRIO:
            if len(payload) < 5:
                raise H2ConnectionError(E.PROTOCOL_ERROR, "HEADERS priority too short")
            payload = payload[5:]
        self._bound_block(len(payload))
        self.block, self.cont_frames = (stream, flags, bytearray(payload)), 0
        if flags & f.END_HEADERS:
            self._on_header_block()

    def _on_continuation(self, flags: int, stream: int, payload: bytes) -> None:
        if self.block is None or stream != self.block[0]:
            raise H2ConnectionError(E.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self.cont_frames += 1
        if self.cont_frames > _MAX_CONT:
            raise H2ConnectionError(E.ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        self._bound_block(len(self.block[2]) + len(payload))
        self.block[2].extend(payload)
        if flags & f.END_HEADERS:
            self._on_header_block()

    def _bound_block(self, n: int) -> None:
        if n > self.limits.max_header_list_size:
            raise H2ConnectionError(E.ENHANCE_YOUR_CALM, f"header block of {n} bytes")

    def _on_header_block(self) -> None:
        assert self.block is not None
        stream, flags, block = self.block
        self.block = None
        try:  # every block is decoded, even refused ones: the HPACK table must stay in sync
            metadata, path, timeout = self.headers.decode(bytes(block))
        except OversizedHeaderListError as exc:
            raise H2ConnectionError(E.ENHANCE_YOUR_CALM, f"header list too large: {exc}") from exc
        except HPACKError as exc:
            raise H2ConnectionError(E.COMPRESSION_ERROR, f"HPACK: {exc}") from exc
        s = self.streams.get(stream)
        if s is not None:  # trailers
            if not flags & f.END_STREAM:
                raise H2StreamError(stream, E.PROTOCOL_ERROR, "trailers without END_STREAM")
            if s.remote_closed:
                raise H2StreamError(stream, E.STREAM_CLOSED, "HEADERS after END_STREAM")
            s.remote_closed = True
            if s.method is not None:  # a unary call waiting for its request
                self.host.ready(self, s)
            s.wake()
            return
        if stream <= self.last_stream:
            return  # late trailers of a stream we answered or reset: ignored
        self.last_stream = stream
        if self.draining:
            raise H2StreamError(stream, E.REFUSED_STREAM, "shutting down")
        if len(self.streams) >= self.limits.max_concurrent_streams:
            raise H2StreamError(stream, E.REFUSED_STREAM, "too many concurrent streams")
        s = Stream(self, stream, path, metadata, timeout)
        s.remote_closed = bool(flags & f.END_STREAM)
        self.streams[stream] = s
        self.host.open(self, s)

    # -- ending streams ----------------------------------------------------------------------
    def reset(self, stream: int, code: ErrorCode, why: str) -> None:
        log.debug("http/2 stream %d error %s: %s", stream, code.name, why)
        self.out.append(f.rst_stream(stream, code))
        self.schedule()
        if (s := self.streams.get(stream)) is not None:
            self.drop(s)

    def drop(self, s: Stream) -> None:
        """Free the stream's state; a method still running is cancelled."""
        s.closed = True
        self.streams.pop(s.id, None)
        if s.inbox_bytes:
            self.consumed(s, s.inbox_bytes)
            s.inbox.clear()
            s.inbox_bytes = 0
        if s.timer is not None:
            s.timer.cancel()
        if s.task is not None and not s.task.done():
            s.task.cancel()
        s.wake()
        if self.draining and not self.streams:
            self.loop.call_soon(self.linger)
