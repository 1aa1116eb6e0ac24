"""Test helpers for the HTTP/2 layer: a fake transport, a frame splitter, request builders."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from hpack import Decoder, Encoder

from runtime.h2 import GrpcH2Server
from runtime.h2.connection import H2Connection
from runtime.h2.frames import DATA, HEADERS, PREFACE, SETTINGS, frame

__all__ = [
    "FakeTransport",
    "frames",
    "grpc_msg",
    "open_conn",
    "replies",
    "request_headers",
    "settle",
]


class FakeTransport:
    def __init__(self) -> None:
        self.sent = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def frames(data: bytes | bytearray) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 3], "big")
        kind, flags = data[pos + 3], data[pos + 4]
        stream = int.from_bytes(data[pos + 5 : pos + 9], "big")
        out.append((kind, flags, stream, bytes(data[pos + 9 : pos + 9 + n])))
        pos += 9 + n
    return out


def grpc_msg(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def request_headers(enc: Encoder, path: str, *extra: tuple[str, str]) -> bytes:
    hs = [(":method", "POST"), (":scheme", "http"), (":path", path)]
    hs += [(":authority", "x"), ("content-type", "application/grpc"), *extra]
    return bytes(enc.encode(hs))


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def open_conn(
    server: GrpcH2Server, window: int = 1 << 20, *, keep: bool = False
) -> tuple[H2Connection, FakeTransport]:
    """A connection of ``server`` on a fake transport, past the preface and SETTINGS."""
    server.loop = asyncio.get_running_loop()
    conn = H2Connection(server)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", 4, window)))
    await settle()
    if not keep:
        t.sent.clear()
    return conn, t


def replies(sent: bytes | bytearray, stream: int) -> tuple[list[bytes], list[Any], bool]:
    """(response messages, decoded header blocks, END_STREAM seen) for one stream."""
    dec, data, ended = Decoder(), bytearray(), False
    blocks: list[Any] = []
    for kind, flags, sid, payload in frames(sent):
        if kind == HEADERS:
            block = dec.decode(payload)
            if sid == stream:
                blocks.append(dict(block))
                ended = ended or bool(flags & 1)
        elif kind == DATA and sid == stream:
            data += payload
    msgs = []
    while data:
        n = int.from_bytes(data[1:5], "big")
        msgs.append(bytes(data[5 : 5 + n]))
        del data[: 5 + n]
    return msgs, blocks, ended
