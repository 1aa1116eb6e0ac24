"""The rate-limit service's HTTP/2 transport on a fake transport: framing, flow control,
control frames (the strictness itself is tested in ``tests/runtime/h2``)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import pytest
from hpack import Encoder

from ratelimit_service.h2server import SHOULD_RATE_LIMIT_PATH, H2Server
from runtime.h2.connection import H2Connection
from runtime.h2.frames import (
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
    frame,
    size_update,
)
from tests.runtime.h2.wire import (
    FakeTransport,
    frames,
    grpc_msg,
    open_conn,
    replies,
    request_headers,
    settle,
)

Handler = Callable[[bytes], Awaitable[bytes]]


async def echo(msg: bytes) -> bytes:
    return b"re:" + msg


async def connect(handler: Handler = echo) -> tuple[H2Connection, FakeTransport, Encoder]:
    conn, t = await open_conn(H2Server(handler), keep=True)
    return conn, t, Encoder()


def call(enc: Encoder, sid: int) -> bytes:
    return frame(HEADERS, END_HEADERS, sid, request_headers(enc, SHOULD_RATE_LIMIT_PATH))


async def test_unary_call_with_continuation_and_padding() -> None:
    conn, t, enc = await connect()
    kinds = [f[0] for f in frames(t.sent)]
    assert kinds[:2] == [SETTINGS, WINDOW_UPDATE] and SETTINGS in kinds[2:]  # ours, then the ACK
    t.sent.clear()
    body = grpc_msg(b"hello")
    block = request_headers(enc, SHOULD_RATE_LIMIT_PATH)
    conn.data_received(
        frame(HEADERS, 0, 1, block[:3])  # header block split: CONTINUATION follows
        + frame(CONT, END_HEADERS, 1, block[3:])
        + frame(DATA, PADDED, 1, bytes((3,)) + body[:4] + b"\x00\x00\x00")  # padded
        + frame(DATA, 0, 1, body[4:7])[:6]  # a frame cut by the read boundary
    )
    conn.data_received(frame(DATA, 0, 1, body[4:7])[6:] + frame(DATA, END_STREAM, 1, body[7:]))
    await settle()
    out = frames(t.sent)
    assert [(k, s) for k, _, s, _ in out] == [(HEADERS, 1), (DATA, 1), (HEADERS, 1)]
    assert out[1][3] == grpc_msg(b"re:hello")
    _, blocks, ended = replies(t.sent, 1)
    assert ended and blocks[-1]["grpc-status"] == "0"


async def test_message_in_one_frame_and_ping() -> None:
    conn, t, enc = await connect()
    t.sent.clear()
    conn.data_received(
        call(enc, 3) + frame(DATA, END_STREAM, 3, grpc_msg(b"abc")) + frame(PING, 0, 0, b"1234abcd")
    )
    await settle()
    out = frames(t.sent)
    assert (PING, 1, 0, b"1234abcd") in out
    assert [f for f in out if f[0] == DATA] == [(DATA, 0, 3, grpc_msg(b"re:abc"))]


async def test_flow_control_waits_for_window_update() -> None:
    conn, t, enc = await connect()
    conn.send_window = 5  # the peer's connection window is nearly used up
    t.sent.clear()
    conn.data_received(call(enc, 5) + frame(DATA, END_STREAM, 5, grpc_msg(b"xyz")))
    await settle()
    assert b"".join(f[3] for f in frames(t.sent) if f[0] == DATA) == grpc_msg(b"re:xyz")[:5]
    conn.data_received(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1000)))
    await settle()
    assert b"".join(f[3] for f in frames(t.sent) if f[0] == DATA) == grpc_msg(b"re:xyz")


async def test_reset_stream_gets_no_answer_and_compressed_is_refused() -> None:
    conn, t, enc = await connect()
    t.sent.clear()
    conn.data_received(call(enc, 7) + frame(RST_STREAM, 0, 7, b"\x00\x00\x00\x08"))
    conn.data_received(frame(DATA, END_STREAM, 7, grpc_msg(b"late")))
    conn.data_received(call(enc, 9) + frame(DATA, END_STREAM, 9, b"\x01\x00\x00\x00\x01z"))
    await settle()
    out = frames(t.sent)
    assert all(s != 7 for _, _, s, _ in out)
    assert replies(t.sent, 9)[1][-1]["grpc-status"] == "12"  # UNIMPLEMENTED


async def test_bad_preface_goes_away() -> None:
    server = H2Server(echo)
    server.loop = asyncio.get_running_loop()
    conn = H2Connection(server)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert t.closed and GOAWAY in [f[0] for f in frames(t.sent)]
    assert PREFACE not in t.sent


async def test_handler_error_answers_internal() -> None:
    async def boom(msg: bytes) -> bytes:
        raise RuntimeError("bug")

    conn, t, enc = await connect(boom)
    t.sent.clear()
    conn.data_received(call(enc, 1) + frame(DATA, END_STREAM, 1, grpc_msg(b"x")))
    await settle()
    last = frames(t.sent)[-1]
    assert last[1] & END_STREAM and replies(t.sent, 1)[1][-1]["grpc-status"] == "13"


@pytest.mark.parametrize("n", [1, 40])
async def test_real_server_answers_grpc_clients(n: int) -> None:
    import grpc

    async def rev(msg: bytes) -> bytes:
        return msg[::-1]

    server = H2Server(rev)
    port = await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            rpc = ch.unary_unary(SHOULD_RATE_LIMIT_PATH)
            got = await asyncio.gather(*(rpc(b"ab%d" % i, timeout=5) for i in range(n)))
            assert got == [(b"ab%d" % i)[::-1] for i in range(n)]
    finally:
        await server.aclose()


async def test_lowered_header_table_gets_a_size_update() -> None:
    conn, t, enc = await connect()
    conn.data_received(frame(SETTINGS, 0, 0, struct.pack(">HI", 1, 0)))
    t.sent.clear()
    for sid in (1, 3):
        conn.data_received(call(enc, sid) + frame(DATA, END_STREAM, sid, grpc_msg(b"q")))
    await settle()
    blocks = [p for k, fl, s, p in frames(t.sent) if k == HEADERS and not fl & END_STREAM]
    assert blocks[0][:1] == b"\x20" and blocks[1][:1] == b"\x88"  # once, first block only
    assert size_update(4000) == b"\x3f\x81\x1f"
