"""Flow control and backpressure of ``runtime.h2`` on a fake transport."""

from __future__ import annotations

import asyncio
import struct

from hpack import Encoder

from runtime.h2 import GrpcH2Server, Limits, Method, Stream
from runtime.h2.frames import DATA, END_HEADERS, GOAWAY, HEADERS, RST_STREAM, SETTINGS, frame
from tests.runtime.h2.wire import grpc_msg, open_conn, replies, request_headers, settle

PATH = "/t.T/Stream"


class Reader:
    """A streaming method that reads only when told to."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.got: list[bytes] = []

    async def __call__(self, s: Stream) -> None:
        await self.go.wait()
        while (m := await s.read()) is not None:
            self.got.append(m)


def updates(sent: bytes | bytearray, stream: int) -> int:
    from tests.runtime.h2.wire import frames

    return sum(struct.unpack(">I", p)[0] for k, _, s, p in frames(sent) if k == 8 and s == stream)


def server(method: Reader, **limits: int) -> GrpcH2Server:
    return GrpcH2Server({PATH: Method(streaming=method)}, limits=Limits(**limits))


async def test_a_stream_that_is_not_read_gets_no_more_credit_until_it_is() -> None:
    reader = Reader()
    conn, t = await open_conn(server(reader, stream_window=40_000))
    conn.data_received(frame(HEADERS, END_HEADERS, 1, request_headers(Encoder(), PATH)))
    conn.data_received(b"".join(frame(DATA, 0, 1, grpc_msg(b"x" * 9995)) for _ in range(4)))
    await settle()
    assert updates(t.sent, 1) == 0 and conn.streams[1].recv_window == 0  # peer must stop
    conn.data_received(frame(DATA, 0, 1, b"\x00"))  # one byte beyond the window
    await settle()
    assert (RST_STREAM, 1) in {(k, s) for k, _, s, _ in _frames(t.sent)}
    reader2 = Reader()
    conn, t = await open_conn(server(reader2, stream_window=40_000))
    conn.data_received(frame(HEADERS, END_HEADERS, 1, request_headers(Encoder(), PATH)))
    conn.data_received(b"".join(frame(DATA, 0, 1, grpc_msg(b"x" * 9995)) for _ in range(4)))
    await settle()
    reader2.go.set()
    await settle()
    assert len(reader2.got) == 4 and updates(t.sent, 1) == 40_000


async def test_data_beyond_the_stream_window_is_a_flow_control_stream_error() -> None:
    conn, t = await open_conn(server(Reader(), stream_window=20_000))
    conn.data_received(frame(HEADERS, END_HEADERS, 1, request_headers(Encoder(), PATH)))
    conn.data_received(frame(DATA, 0, 1, b"\x00" * 16384) + frame(DATA, 0, 1, b"\x00" * 4000))
    await settle()
    rst = [p for k, _, s, p in _frames(t.sent) if k == RST_STREAM and s == 1]
    assert rst == [struct.pack(">I", 3)] and 1 not in conn.streams and not t.closed


async def test_unread_bytes_pause_the_transport_until_half_is_read() -> None:
    reader = Reader()
    conn, t = await open_conn(server(reader, max_buffered=50_000))
    enc = Encoder()
    for sid in (1, 3, 5, 7):
        conn.data_received(frame(HEADERS, END_HEADERS, sid, request_headers(enc, PATH)))
        conn.data_received(frame(DATA, 0, sid, grpc_msg(b"y" * 15_000)))
    await settle()
    assert not t.reading
    reader.go.set()
    await settle()
    assert t.reading and conn.buffered == 0


async def test_a_peer_that_stops_reading_pauses_our_reading() -> None:
    conn, t = await open_conn(server(Reader()))
    conn.pause_writing()
    assert not t.reading
    conn.resume_writing()
    assert t.reading


async def test_initial_window_overflow_is_a_connection_error() -> None:
    conn, t = await open_conn(server(Reader()), window=65535)
    conn.data_received(frame(HEADERS, END_HEADERS, 1, request_headers(Encoder(), PATH)))
    conn.data_received(frame(8, 0, 1, struct.pack(">I", 0x7FFFFFFF - 65535)))
    conn.data_received(frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65536)))
    goaway = [p for k, _, _, p in _frames(t.sent) if k == GOAWAY]
    assert goaway and struct.unpack(">II", goaway[0][:8]) == (1, 3) and t.closed


async def test_answers_wait_for_the_peer_window_and_split_at_its_frame_size() -> None:
    async def big(s: Stream) -> None:
        await s.write(b"z" * 100_000)

    srv = GrpcH2Server({PATH: Method(streaming=big)})
    conn, t = await open_conn(srv, window=30_000)
    conn.data_received(frame(HEADERS, END_HEADERS | 1, 1, request_headers(Encoder(), PATH)))
    await settle()
    sent = sum(len(p) for k, _, s, p in _frames(t.sent) if k == DATA)
    assert sent == 30_000
    conn.data_received(frame(8, 0, 1, struct.pack(">I", 200_000)))
    conn.data_received(frame(8, 0, 0, struct.pack(">I", 200_000)))
    await settle()
    msgs, blocks, ended = replies(t.sent, 1)
    assert msgs == [b"z" * 100_000] and ended and blocks[-1]["grpc-status"] == "0"
    assert max(len(p) for k, _, _, p in _frames(t.sent) if k == DATA) <= 16384


def _frames(sent: bytes | bytearray) -> list[tuple[int, int, int, bytes]]:
    from tests.runtime.h2.wire import frames

    return frames(sent)
