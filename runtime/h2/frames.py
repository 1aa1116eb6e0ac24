"""HTTP/2 frame constants, frame and header-block builders, limits, and ``grpc-timeout``.

Answers use HPACK static-table and literal-without-indexing encodings only, so the server keeps
no encoder state beyond a pending dynamic-table size update (owed after the peer lowers its
table size)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "ACK",
    "CONT",
    "DATA",
    "END_HEADERS",
    "END_STREAM",
    "GOAWAY",
    "HEADERS",
    "MAX_WINDOW",
    "OK_TRAILERS",
    "PADDED",
    "PING",
    "PREFACE",
    "PRIO",
    "PRIORITY",
    "PUSH_PROMISE",
    "RESPONSE_HEADERS",
    "RST_STREAM",
    "SETTINGS",
    "WINDOW_UPDATE",
    "Limits",
    "frame",
    "goaway",
    "parse_timeout",
    "rst_stream",
    "size_update",
    "trailers",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONT = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIO = 0x1, 0x1, 0x4, 0x8, 0x20
MAX_WINDOW = (1 << 31) - 1

# SETTINGS identifiers (RFC 9113 §6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 1, 2, 3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 4, 5, 6


@dataclass(frozen=True)
class Limits:
    """What a server accepts; the defaults follow grpcio (4 MiB messages) and nghttp2.

    ``stream_window`` is advertised as SETTINGS_INITIAL_WINDOW_SIZE and returned to the peer only
    as the application consumes what it received (backpressure); ``connection_window`` is
    returned as frames arrive (a slow stream must not stall its neighbours); ``max_buffered``
    bytes received but not yet read by the application pause the transport until half is read.
    """

    max_frame_size: int = 16384
    max_header_list_size: int = 16384
    max_concurrent_streams: int = 1000
    max_message: int = 4 * 1024 * 1024
    stream_window: int = 1024 * 1024
    connection_window: int = 4 * 1024 * 1024
    max_buffered: int = 16 * 1024 * 1024
    reset_burst: int = 1000  # RST_STREAMs a client may send at once …
    reset_rate: float = 100.0  # … and per second after that (rapid-reset guard)

    def settings(self) -> bytes:
        return struct.pack(
            ">HIHIHIHIHI",
            ENABLE_PUSH,
            0,
            MAX_CONCURRENT_STREAMS,
            self.max_concurrent_streams,
            INITIAL_WINDOW_SIZE,
            self.stream_window,
            MAX_FRAME_SIZE,
            self.max_frame_size,
            MAX_HEADER_LIST_SIZE,
            self.max_header_list_size,
        )


_HEAD = struct.Struct(">IBI")  # (24-bit length, type) in one word, flags, stream id


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream) + payload


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream, code) + debug)


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def _literal(name: bytes, value: bytes) -> bytes:
    """Literal header field without indexing, new name, lengths < 127 (RFC 7541 §6.2.2)."""
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


# :status 200 (static index 8); content-type (static name 31) = application/grpc
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + bytes((len(b"application/grpc"),)) + b"application/grpc"


def trailers(status: int, message: str = "") -> bytes:
    block = _literal(b"grpc-status", str(int(status)).encode())
    if message:
        safe = "".join(c if " " <= c <= "~" and c != "%" else "?" for c in message)
        block += _literal(b"grpc-message", safe.encode()[:120])
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


_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str) -> float | None:
    """Seconds in a ``grpc-timeout`` value (1–8 digits and a unit), or None when malformed."""
    unit = _UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not 0 < len(digits) <= 8 or not digits.isdigit():
        return None
    return int(digits) * unit
