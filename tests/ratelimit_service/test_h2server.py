"""The built-in HTTP/2 gRPC server on a fake transport: framing, flow control, control frames."""

from __future__ import annotations

import asyncio
import struct

import pytest

from ratelimit_service.h2server import (
    CONT,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    H2Server,
    _Conn,
    _frame,
    size_update,
)


class FakeTransport:
    def __init__(self) -> None:
        self.sent = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
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


async def connect(handler=None) -> tuple[_Conn, FakeTransport]:  # type: ignore[no-untyped-def]
    async def echo(msg: bytes) -> bytes:
        return b"re:" + msg

    server = H2Server(handler or echo)
    server.loop = asyncio.get_running_loop()
    conn = _Conn(server)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(PREFACE + _frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 20)))
    await asyncio.sleep(0.01)
    return conn, t


async def settle_io() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_unary_call_with_continuation_and_padding() -> None:
    conn, t = await connect()
    kinds = [f[0] for f in frames(t.sent)]
    assert kinds[:2] == [SETTINGS, WINDOW_UPDATE] and SETTINGS in kinds[2:]  # ours, then the ACK
    t.sent.clear()
    body = grpc_msg(b"hello")
    conn.data_received(
        _frame(HEADERS, 0, 1, b"\x82")  # header block split: CONTINUATION follows
        + _frame(CONT, END_HEADERS, 1, b"\x86")
        + _frame(DATA, PADDED, 1, bytes((3,)) + body[:4] + b"\x00\x00\x00")  # padded
        + _frame(DATA, 0, 1, body[4:7])[:6]  # a frame cut by the read boundary
    )
    conn.data_received(_frame(DATA, 0, 1, body[4:7])[6:] + _frame(DATA, END_STREAM, 1, body[7:]))
    await settle_io()
    out = frames(t.sent)
    assert [(k, s) for k, _, s, _ in out] == [(HEADERS, 1), (DATA, 1), (HEADERS, 1)]
    assert out[1][3] == grpc_msg(b"re:hello")
    assert out[2][1] & END_STREAM and b"grpc-status" in out[2][3]


async def test_message_in_one_frame_and_ping() -> None:
    conn, t = await connect()
    t.sent.clear()
    conn.data_received(
        _frame(HEADERS, END_HEADERS, 3, b"\x82")
        + _frame(DATA, END_STREAM, 3, grpc_msg(b"abc"))
        + _frame(PING, 0, 0, b"12345678")
    )
    await settle_io()
    out = frames(t.sent)
    assert (PING, 1, 0, b"12345678") in out
    data = [f for f in out if f[0] == DATA]
    assert data == [(DATA, 0, 3, grpc_msg(b"re:abc"))]


async def test_flow_control_waits_for_window_update() -> None:
    conn, t = await connect()
    conn.send_window = 5  # the peer's connection window is nearly used up
    t.sent.clear()
    conn.data_received(
        _frame(HEADERS, END_HEADERS, 5, b"\x82") + _frame(DATA, END_STREAM, 5, grpc_msg(b"xyz"))
    )
    await settle_io()
    assert [f for f in frames(t.sent) if f[0] == DATA] == []
    conn.data_received(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1000)))
    await settle_io()
    assert [f[3] for f in frames(t.sent) if f[0] == DATA] == [grpc_msg(b"re:xyz")]


async def test_reset_stream_gets_no_answer_and_compressed_is_refused() -> None:
    conn, t = await connect()
    t.sent.clear()
    conn.data_received(
        _frame(HEADERS, END_HEADERS, 7, b"\x82") + _frame(RST_STREAM, 0, 7, b"\x00\x00\x00\x08")
    )
    conn.data_received(_frame(DATA, END_STREAM, 7, grpc_msg(b"late")))
    conn.data_received(
        _frame(HEADERS, END_HEADERS, 9, b"\x82")
        + _frame(DATA, END_STREAM, 9, b"\x01\x00\x00\x00\x01z")
    )
    await settle_io()
    out = frames(t.sent)
    assert all(s != 7 for _, _, s, _ in out)
    trailers = [p for k, fl, s, p in out if s == 9 and k == HEADERS and fl & END_STREAM]
    assert trailers and b"12" in trailers[0]  # UNIMPLEMENTED


async def test_bad_preface_goes_away() -> None:
    server = H2Server(lambda m: asyncio.sleep(0, m))  # type: ignore[arg-type, return-value]
    server.loop = asyncio.get_running_loop()
    conn = _Conn(server)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert t.closed and GOAWAY in [f[0] for f in frames(t.sent)]


async def test_handler_error_answers_internal() -> None:
    async def boom(msg: bytes) -> bytes:
        raise RuntimeError("bug")

    conn, t = await connect(boom)
    t.sent.clear()
    conn.data_received(
        _frame(HEADERS, END_HEADERS, 1, b"\x82") + _frame(DATA, END_STREAM, 1, grpc_msg(b"x"))
    )
    await settle_io()
    last = frames(t.sent)[-1]
    assert last[1] & END_STREAM and b"grpc-status\x0213" in last[3]


@pytest.mark.parametrize("n", [1, 40])
async def test_real_server_answers_grpc_clients(n: int) -> None:
    import grpc

    async def echo(msg: bytes) -> bytes:
        return msg[::-1]

    server = H2Server(echo)
    port = await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary("/x.Y/Z", request_serializer=None, response_deserializer=None)
            replies = await asyncio.gather(*(call(b"ab%d" % i, timeout=5) for i in range(n)))
            assert replies == [(b"ab%d" % i)[::-1] for i in range(n)]
    finally:
        await server.aclose()


async def test_lowered_header_table_gets_a_size_update() -> None:
    conn, t = await connect()
    conn.data_received(_frame(SETTINGS, 0, 0, struct.pack(">HI", 1, 0)))
    t.sent.clear()
    for sid in (1, 3):
        conn.data_received(
            _frame(HEADERS, END_HEADERS, sid, b"\x82")
            + _frame(DATA, END_STREAM, sid, grpc_msg(b"q"))
        )
    await settle_io()
    blocks = [p for k, fl, s, p in frames(t.sent) if k == HEADERS and not fl & END_STREAM]
    assert blocks[0][:1] == b"\x20" and blocks[1][:1] == b"\x88"  # once, first block only
    assert size_update(4000) == b"\x3f\x81\x1f"
