"""Control frames of :class:`runtime.h2.connection.H2Connection`: SETTINGS, WINDOW_UPDATE,
RST_STREAM (with the rapid-reset guard), PING, PRIORITY and GOAWAY, each checked as RFC 9113
§6 requires (a malformed one raises the connection or stream error the RFC names).

The rapid-reset guard (CVE-2023-44487) counts only *premature* resets: of a stream the server
has not answered yet (work started and thrown away). Envoy ends every ext_proc stream with a
RST_STREAM once its request is done, after our answers: counting those too (at most 100 a
second beyond a burst of 1,000) closed Envoy's connection to the filter server with GOAWAY
ENHANCE_YOUR_CALM after about 20 s at 150 requests a second, and every call on it failed
(``ext_proc_error_gRPC_error_13{...connection_termination}``, issue 9). Each stream the server
answers earns one premature reset back (up to the burst), so a peer whose calls time out
under load is not cut off while most of its calls are answered."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from runtime.h2 import frames as f
from runtime.h2.errors import ErrorCode, H2ConnectionError, H2StreamError
from runtime.h2.stream import Stream


class _Clocked(Protocol):
    @property
    def clock(self) -> Callable[[], float]: ...


class Connection(Protocol):
    """What the control frames read and change of a connection
    (:class:`runtime.h2.connection.H2Connection`), named here so that this module imports
    nothing of the connection's."""

    draining: bool
    send_window: int
    resets: float
    reset_at: float
    table_update: bytes
    peer_initial: int
    peer_max_frame: int

    @property
    def host(self) -> _Clocked: ...
    @property
    def limits(self) -> f.Limits: ...
    @property
    def streams(self) -> dict[int, Stream]: ...
    @property
    def last_stream(self) -> int: ...
    @property
    def out(self) -> list[bytes]: ...

    def schedule(self) -> None: ...
    def linger(self) -> None: ...
    def drop(self, s: Stream) -> None: ...
    def wake_writers(self) -> None: ...


__all__ = [
    "on_goaway",
    "on_ping",
    "on_priority",
    "on_rst_stream",
    "on_settings",
    "on_window_update",
]

E = ErrorCode


def on_ping(conn: Connection, flags: int, stream: int, payload: bytes) -> None:
    if len(payload) != 8:
        raise H2ConnectionError(E.FRAME_SIZE_ERROR, "PING of the wrong size")
    if stream:
        raise H2ConnectionError(E.PROTOCOL_ERROR, "PING on a stream")
    if not flags & f.ACK:
        conn.out.append(f.frame(f.PING, f.ACK, 0, payload))
        conn.schedule()


def on_priority(stream: int, payload: bytes) -> None:
    if not stream:
        raise H2ConnectionError(E.PROTOCOL_ERROR, "PRIORITY on stream 0")
    if len(payload) != 5:
        raise H2StreamError(stream, E.FRAME_SIZE_ERROR, "PRIORITY of the wrong size")


def on_goaway(conn: Connection, stream: int, payload: bytes) -> None:
    if stream:
        raise H2ConnectionError(E.PROTOCOL_ERROR, "GOAWAY on a stream")
    if len(payload) < 8:
        raise H2ConnectionError(E.FRAME_SIZE_ERROR, "GOAWAY too short")
    conn.draining = True
    if not conn.streams:
        conn.linger()


def on_window_update(conn: Connection, stream: int, payload: bytes) -> None:
    if len(payload) != 4:
        raise H2ConnectionError(E.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
    inc = int.from_bytes(payload, "big") & 0x7FFFFFFF
    if not stream:
        if not inc:
            raise H2ConnectionError(E.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        conn.send_window += inc
        if conn.send_window > f.MAX_WINDOW:
            raise H2ConnectionError(E.FLOW_CONTROL_ERROR, "connection window overflow")
    elif (s := conn.streams.get(stream)) is not None:
        if not inc:
            raise H2StreamError(stream, E.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        s.send_window += inc
        if s.send_window > f.MAX_WINDOW:
            raise H2StreamError(stream, E.FLOW_CONTROL_ERROR, "stream window overflow")
    elif stream > conn.last_stream:
        raise H2ConnectionError(E.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
    conn.wake_writers()


def on_rst_stream(conn: Connection, stream: int, payload: bytes) -> None:
    if len(payload) != 4:
        raise H2ConnectionError(E.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
    if not stream or stream > conn.last_stream:
        raise H2ConnectionError(E.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
    s = conn.streams.get(stream)
    if s is None:
        return  # a stream we already ended: nothing was wasted
    if not s.headers_sent:  # reset before we answered anything: what a rapid-reset flood does
        now, lim = conn.host.clock(), conn.limits
        conn.resets = min(lim.reset_burst, conn.resets + (now - conn.reset_at) * lim.reset_rate)
        conn.reset_at = now
        conn.resets -= 1
        if conn.resets < 0:
            raise H2ConnectionError(E.ENHANCE_YOUR_CALM, "too many stream resets")
    conn.drop(s)


def on_settings(conn: Connection, flags: int, stream: int, payload: bytes) -> None:
    if stream:
        raise H2ConnectionError(E.PROTOCOL_ERROR, "SETTINGS on a stream")
    if flags & f.ACK:
        if payload:
            raise H2ConnectionError(E.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
        return
    if len(payload) % 6:
        raise H2ConnectionError(E.FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
    for i in range(0, len(payload), 6):
        ident, value = struct.unpack_from(">HI", payload, i)
        if ident == 1 and value < 4096:
            conn.table_update = f.size_update(value)
        elif ident == 2 and value > 1:
            raise H2ConnectionError(E.PROTOCOL_ERROR, "ENABLE_PUSH must be 0 or 1")
        elif ident == 4:
            if value > f.MAX_WINDOW:
                raise H2ConnectionError(E.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
            delta, conn.peer_initial = value - conn.peer_initial, value
            for s in conn.streams.values():
                s.send_window += delta
                if s.send_window > f.MAX_WINDOW:
                    raise H2ConnectionError(E.FLOW_CONTROL_ERROR, "stream window overflow")
            conn.wake_writers()
        elif ident == 5:
            if not 16384 <= value <= (1 << 24) - 1:
                raise H2ConnectionError(E.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
            conn.peer_max_frame = value
    conn.out.append(f.frame(f.SETTINGS, f.ACK, 0))
    conn.schedule()
