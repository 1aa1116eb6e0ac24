"""The ext_proc HTTP/2 transport on a fake transport: HPACK, framing, flow control, resets."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hpack import Decoder, Encoder

from filters.h2server import EOF, PROCESS_PATH, H2FilterServer
from runtime.h2 import Limits
from runtime.h2.connection import H2Connection
from runtime.h2.frames import (
    CONT,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PRIO,
    RST_STREAM,
    WINDOW_UPDATE,
    frame,
)
from tests.runtime.h2.wire import FakeTransport, frames, open_conn, settle


class EchoServicer:
    """Answers each request with a response whose body echoes the request body's length."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.routes: list[str | None] = []
        self.cancelled = 0

    async def Process(self, _: Any, ctx: Any) -> None:
        self.routes.append(dict(ctx.invocation_metadata()).get("x-tokenweir-route"))
        try:
            while (req := await ctx.read()) is not EOF:
                if self.fail:
                    raise RuntimeError("boom")
                n = len(req.request_body.body)
                body = pb.BodyResponse(response=pb.CommonResponse(body_mutation=None))
                body.response.body_mutation.body = b"x" * (n // 2)
                await ctx.write(pb.ProcessingResponse(request_body=body))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def request(n: int) -> bytes:
    msg = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"b" * n)).SerializeToString()
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


def headers(enc: Encoder, route: str, path: str = PROCESS_PATH) -> bytes:
    hs = [(":method", "POST"), (":scheme", "http"), (":path", path)]
    hs += [(":authority", "tokenweir_filters"), ("content-type", "application/grpc")]
    return bytes(enc.encode([*hs, ("x-tokenweir-route", route)]))  # Huffman + indexing


async def connect(
    servicer: Any = None, window: int = 1 << 20, limits: Limits | None = None
) -> tuple[H2Connection, FakeTransport, EchoServicer]:
    svc = servicer or EchoServicer()
    server = H2FilterServer(svc, "127.0.0.1", 0, limits=limits)  # type: ignore[arg-type]
    conn, t = await open_conn(server.grpc, window)
    return conn, t, svc


def replies(sent: bytes | bytearray, stream: int) -> tuple[list[int], list[Any], bool]:
    """(sizes of the response messages, decoded header blocks, END_STREAM seen) for a stream."""
    dec, data, ended = Decoder(), bytearray(), False
    blocks: list[Any] = []
    for kind, flags, sid, payload in frames(sent):
        if kind == HEADERS:
            block = dec.decode(payload)
            if sid == stream:
                blocks.append(block)
                ended = ended or bool(flags & END_STREAM)
        elif kind == DATA and sid == stream:
            data += payload
    sizes = []
    while data:
        n = int.from_bytes(data[1:5], "big")
        sizes.append(
            len(pb.ProcessingResponse.FromString(bytes(data[5 : 5 + n])).SerializeToString())
        )
        del data[: 5 + n]
    return sizes, blocks, ended


def status(blocks: list[Any]) -> str:
    return dict(blocks[-1])["grpc-status"]


async def test_huffman_dynamic_table_continuation_padding_and_priority() -> None:
    conn, t, svc = await connect()
    enc = Encoder()
    block = headers(enc, "chat")
    padded = bytes((3,)) + b"\x00\x00\x00\x00\x10" + block[:10] + b"\x00" * 3
    conn.data_received(
        frame(HEADERS, PADDED | PRIO, 1, padded) + frame(CONT, END_HEADERS, 1, block[10:])
    )
    second = headers(enc, "embed")  # mostly dynamic-table references now
    assert len(second) < len(block)
    conn.data_received(frame(HEADERS, END_HEADERS, 3, second))
    conn.data_received(frame(DATA, END_STREAM, 1, request(10)) + frame(DATA, END_STREAM, 3, b""))
    await settle()
    assert svc.routes == ["chat", "embed"]
    sizes, blocks, ended = replies(t.sent, 1)
    assert len(sizes) == 1 and ended and status(blocks) == "0"
    assert dict(blocks[0])[":status"] == "200"
    _, blocks3, ended3 = replies(t.sent, 3)
    assert ended3 and status(blocks3) == "0" and len(blocks3) == 1  # trailers-only
    assert conn.streams == {} and not conn.host.tasks


async def test_messages_span_frames_and_share_frames_both_ways() -> None:
    conn, t, _ = await connect()
    conn.data_received(frame(HEADERS, END_HEADERS, 1, headers(Encoder(), "chat")))
    big = request(1 << 20)  # a 1 MiB body: 65 DATA frames
    wire = b"".join(frame(DATA, 0, 1, big[i : i + 16384]) for i in range(0, len(big), 16384))
    two = request(3) + request(5)  # two messages in one frame, the second split in two frames
    conn.data_received(wire + frame(DATA, 0, 1, two[:-4]))
    await settle()
    assert sum(len(p) for k, _, _, p in frames(t.sent) if k == DATA) == 65535  # connection window
    conn.data_received(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
    conn.data_received(frame(DATA, END_STREAM | PADDED, 1, b"\x02" + two[-4:] + b"\x00\x00"))
    await settle()
    sizes, blocks, ended = replies(t.sent, 1)
    assert len(sizes) == 3 and sizes[0] > 1 << 19 and ended and status(blocks) == "0"
    assert max(len(p) for k, _, _, p in frames(t.sent) if k == DATA) <= 16384


async def test_send_waits_for_stream_and_connection_windows() -> None:
    conn, t, _ = await connect(window=1000)
    conn.data_received(frame(HEADERS, END_HEADERS, 1, headers(Encoder(), "chat")))
    body = request(200_000)  # answer: ~100 KB
    chunks = [body[i : i + 16384] for i in range(0, len(body), 16384)]
    conn.data_received(b"".join(frame(DATA, 0, 1, c) for c in chunks[:-1]))
    conn.data_received(frame(DATA, END_STREAM, 1, chunks[-1]))
    await settle()
    sent = sum(len(p) for k, _, _, p in frames(t.sent) if k == DATA)
    assert sent == 1000 and 1 in conn.streams
    conn.data_received(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100_000)))
    await settle()
    sent = sum(len(p) for k, _, _, p in frames(t.sent) if k == DATA)
    assert sent == 1000 + 64535  # now the connection window (65535) is the limit
    conn.data_received(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 100_000)))
    await settle()
    sizes, blocks, ended = replies(t.sent, 1)
    assert sizes and ended and status(blocks) == "0" and conn.streams == {}


async def test_receive_windows_are_replenished() -> None:
    limits = Limits(stream_window=100_000, connection_window=100_000)
    conn, t, _ = await connect(limits=limits)
    conn.data_received(frame(HEADERS, END_HEADERS, 1, headers(Encoder(), "chat")))
    conn.data_received(frame(DATA, 0, 1, request(15000)) + frame(DATA, 0, 1, request(15000)))
    await settle()
    updates = {
        (s, struct.unpack(">I", p)[0]) for k, _, s, p in frames(t.sent) if k == WINDOW_UPDATE
    }
    assert (0, 2 * len(request(15000))) in updates and (1, 2 * len(request(15000))) in updates


async def test_reset_stream_cancels_and_frees_it() -> None:
    conn, t, svc = await connect()
    conn.data_received(frame(HEADERS, END_HEADERS, 1, headers(Encoder(), "chat")))
    conn.data_received(frame(DATA, 0, 1, request(4)))
    await settle()
    assert 1 in conn.streams and conn.host.tasks
    t.sent.clear()
    conn.data_received(frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))
    await settle()
    assert svc.cancelled == 1 and conn.streams == {} and not conn.host.tasks
    conn.data_received(frame(DATA, END_STREAM, 1, request(4)))  # late data: dropped
    await settle()
    assert t.sent == b""


async def test_errors_unknown_method_and_compression_end_with_grpc_status() -> None:
    conn, t, _ = await connect(EchoServicer(fail=True))
    enc = Encoder()
    conn.data_received(frame(HEADERS, END_HEADERS, 1, headers(enc, "chat")))
    conn.data_received(frame(DATA, 0, 1, request(4)))
    conn.data_received(frame(HEADERS, END_HEADERS, 3, headers(enc, "chat", "/other.Service/X")))
    conn.data_received(frame(HEADERS, END_HEADERS, 5, headers(enc, "chat")))
    conn.data_received(frame(DATA, 0, 5, b"\x01" + request(4)[1:]))
    await settle()
    codes = {s: status(replies(t.sent, s)[1]) for s in (1, 3, 5)}
    assert codes == {1: "13", 3: "12", 5: "12"}
    rst = {s for k, _, s, _ in frames(t.sent) if k == RST_STREAM}
    assert rst == {1, 3, 5}  # the client had not finished: RST_STREAM(NO_ERROR) after trailers
    assert conn.streams == {} and not conn.host.tasks


async def test_protocol_errors_go_away() -> None:
    conn, t, _ = await connect()
    conn.data_received(frame(HEADERS, 0, 1, headers(Encoder(), "chat")[:5]))
    conn.data_received(frame(DATA, 0, 1, b"x"))  # not the CONTINUATION owed
    assert frames(t.sent)[-1][0] == GOAWAY and t.closed
    conn2, t2, _ = await connect()
    conn2.data_received(frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f"))  # bad HPACK
    assert frames(t2.sent)[-1][0] == GOAWAY and t2.closed


async def test_aclose_goes_away_and_cancels_streams_left() -> None:
    conn, t, svc = await connect()
    conn.data_received(frame(HEADERS, END_HEADERS, 1, headers(Encoder(), "chat")))
    await settle()
    await conn.host.aclose(grace=0.05)
    assert frames(t.sent)[0][0] == GOAWAY and t.closed
    assert svc.cancelled == 1 and not conn.host.tasks
