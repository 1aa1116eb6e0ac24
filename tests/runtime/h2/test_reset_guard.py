"""The rapid-reset guard of ``runtime.h2`` counts only premature resets (issue 9).

Envoy ends every ext_proc stream with a RST_STREAM once its HTTP request is done, after the
filter server has answered. The guard used to count those too: at a steady 150 requests a
second it closed Envoy's only connection to the filter server with GOAWAY ENHANCE_YOUR_CALM
after ~20 s, failing every call on it (the reload test's 500s). The clock is frozen here, so
no token comes back with time: only the kind of reset decides."""

from __future__ import annotations

import struct

from hpack import Encoder

from runtime.h2 import GrpcH2Server, Method, Stream
from runtime.h2.frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    RST_STREAM,
    Limits,
    frame,
)
from tests.runtime.h2.wire import frames, grpc_msg, open_conn, replies, request_headers, settle

PATH = "/t.T/Process"
CANCEL = struct.pack(">I", 8)
CALM = 11


async def _answer_then_wait(s: Stream) -> None:
    """Like an ext_proc stream: one answer per message, until the peer ends or resets it."""
    while (m := await s.read()) is not None:
        await s.write(m)


def _server() -> GrpcH2Server:
    return GrpcH2Server(
        {PATH: Method(streaming=_answer_then_wait)},
        limits=Limits(reset_burst=100, reset_rate=100.0),
        clock=lambda: 0.0,  # frozen: no token comes back with time
    )


def _goaway(sent: bytes | bytearray) -> int | None:
    for kind, _, _, payload in frames(sent):
        if kind == GOAWAY:
            return int(struct.unpack(">II", payload[:8])[1])
    return None


async def test_resets_of_answered_streams_never_trip_the_guard() -> None:
    conn, t = await open_conn(_server())
    enc = Encoder()
    for i in range(300):  # 3x the burst, all within the same instant
        sid = 2 * i + 1
        conn.data_received(
            frame(HEADERS, END_HEADERS, sid, request_headers(enc, PATH))
            + frame(DATA, 0, sid, grpc_msg(b"body"))
        )
        await settle()
        assert replies(t.sent, sid)[0] == [b"body"]  # answered ...
        conn.data_received(frame(RST_STREAM, 0, sid, CANCEL))  # ... then reset, as Envoy does
    await settle()
    assert _goaway(t.sent) is None and not conn.closed
    conn.data_received(
        frame(HEADERS, END_HEADERS, 601, request_headers(enc, PATH))
        + frame(DATA, END_STREAM, 601, grpc_msg(b"still served"))
    )
    await settle()
    assert replies(t.sent, 601)[0] == [b"still served"]


async def test_premature_resets_are_offset_by_answered_streams() -> None:
    """A peer whose calls time out under load (reset before an answer) while most are answered."""
    conn, t = await open_conn(_server())
    enc = Encoder()
    for i in range(300):
        answered, early = 4 * i + 1, 4 * i + 3
        conn.data_received(
            frame(HEADERS, END_HEADERS, answered, request_headers(enc, PATH))
            + frame(DATA, 0, answered, grpc_msg(b"x"))
        )
        await settle()
        conn.data_received(
            frame(HEADERS, END_HEADERS, early, request_headers(enc, PATH))  # no message: no answer
            + frame(RST_STREAM, 0, early, CANCEL)
            + frame(RST_STREAM, 0, answered, CANCEL)
        )
    await settle()
    assert _goaway(t.sent) is None and not conn.closed


async def test_premature_resets_beyond_the_burst_still_go_away() -> None:
    conn, t = await open_conn(_server())
    enc = Encoder()
    flood = b"".join(
        frame(HEADERS, END_HEADERS, 2 * i + 1, request_headers(enc, PATH))
        + frame(RST_STREAM, 0, 2 * i + 1, CANCEL)
        for i in range(101)
    )
    conn.data_received(flood)
    await settle()
    assert _goaway(t.sent) == CALM
