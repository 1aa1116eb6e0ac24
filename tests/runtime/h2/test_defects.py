"""One test per defect of the old built-in transports (issue 9), against LIVE servers of both
services over real sockets: each failed on the transports before ``runtime.h2``."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hpack import Decoder, Encoder

from filters.h2server import PROCESS_PATH
from tests.runtime.h2.live import Answer, exchange, live_filters, live_rls, settings_of

RLS_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
DATA, HEADERS, RST, SETTINGS, PUSH, WINDOW_UPDATE, CONT = 0, 1, 3, 4, 5, 8, 9
FRAME_SIZE_ERROR, FLOW_CONTROL_ERROR, REFUSED, CALM, PROTOCOL = 6, 3, 7, 11, 1


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes((kind, flags)) + struct.pack(">I", stream) + payload
    )


def msg(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class Server:
    def __init__(self, port: int, path: str) -> None:
        self.port, self.path, self.enc = port, path, Encoder()

    def headers(
        self, sid: int, *extra: tuple[str, str], path: str | None = None, end: int = 0x4
    ) -> bytes:
        hs = [(":method", "POST"), (":scheme", "http"), (":path", path or self.path)]
        hs += [(":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")]
        return frame(HEADERS, end, sid, bytes(self.enc.encode([*hs, *extra])))


async def _hang(_: bytes) -> bytes:
    await asyncio.Event().wait()
    return b""


async def _echo(m: bytes) -> bytes:
    return m


class Hanging:
    """An ext_proc servicer that reads nothing and never answers (until cancelled)."""

    async def Process(self, _: Any, ctx: Any) -> None:
        await asyncio.Event().wait()


@pytest.fixture(params=["rls", "filters"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    if request.param == "rls":
        async with live_rls(_hang) as port:
            yield Server(port, RLS_PATH)
    else:
        async with live_filters(Hanging()) as port:
            yield Server(port, PROCESS_PATH)


def status_of(answer: Answer, sid: int) -> str | None:
    dec = Decoder()
    status = None
    for kind, flags, s, p in answer.frames:
        if kind == HEADERS:
            block = dict(dec.decode(p))
            if s == sid and flags & 1:
                status = block.get("grpc-status")
    return status


def ended(sid: int) -> Any:
    return lambda fs: any(k == HEADERS and fl & 1 and s == sid for k, fl, s, _ in fs)


def gone(fs: list[tuple[int, int, int, bytes]]) -> bool:
    return any(k == 7 for k, *_ in fs)


async def test_frames_over_max_frame_size_are_a_connection_error(server: Server) -> None:
    big = (16 * 1024 * 1024 - 1).to_bytes(3, "big") + bytes((DATA, 0)) + struct.pack(">I", 1)
    answer = await exchange(server.port, server.headers(1) + big + b"x" * 100_000, gone)
    assert answer.goaway() is not None and answer.goaway()[1] == FRAME_SIZE_ERROR  # type: ignore[index]


async def test_continuation_flood_is_bounded(server: Server) -> None:
    start = server.headers(1, end=0)
    flood = b"".join(frame(CONT, 0, 1, b"\x00" * 16384) for _ in range(200))  # 3.2 MB, no end
    answer = await exchange(server.port, start + flood, gone)
    assert answer.goaway() == (0, CALM)


async def test_a_2_gib_length_prefix_is_refused_not_buffered(server: Server) -> None:
    prefix = b"\x00\x7f\xff\xff\xf0" + b"x" * 1000
    answer = await exchange(server.port, server.headers(1) + frame(DATA, 0, 1, prefix), ended(1))
    assert status_of(answer, 1) == "8"  # RESOURCE_EXHAUSTED


async def test_concurrent_stream_limit_is_advertised_and_enforced(server: Server) -> None:
    limit = settings_of(await exchange(server.port, b"", lambda fs: bool(fs)))[3]
    assert limit <= 20_000
    opens = b"".join(server.headers(2 * i + 1) for i in range(limit + 1))
    last = 2 * limit + 1
    answer = await exchange(server.port, opens, lambda fs: any(s == last for _, _, s, _ in fs))
    assert answer.resets() == {last: REFUSED}


async def test_receive_windows_are_bounded(server: Server) -> None:
    answer = await exchange(server.port, b"", lambda fs: len(fs) >= 3)
    initial = settings_of(answer).get(4, 65535)
    granted = sum(int.from_bytes(p, "big") for k, _, s, p in answer.frames if k == 8 and s == 0)
    assert initial <= 16 * 1024**2 and 65535 + granted <= 16 * 1024**2


async def test_window_overflow_is_a_flow_control_error(server: Server) -> None:
    inc = frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF))
    answer = await exchange(server.port, inc + inc, gone)
    assert answer.goaway() == (0, FLOW_CONTROL_ERROR)


async def test_a_short_window_update_goes_away_with_frame_size_error(server: Server) -> None:
    answer = await exchange(server.port, frame(WINDOW_UPDATE, 0, 0, b"\x00\x01\x00"), gone)
    assert answer.goaway() == (0, FRAME_SIZE_ERROR)


async def test_grpc_timeout_is_honoured(server: Server) -> None:
    data = server.headers(1, ("grpc-timeout", "50m")) + frame(DATA, 1, 1, msg(b"q"))
    answer = await exchange(server.port, data, ended(1))
    assert status_of(answer, 1) == "4"  # DEADLINE_EXCEEDED


async def test_an_unknown_path_is_unimplemented(server: Server) -> None:
    data = server.headers(1, path="/no.Such/Method") + frame(DATA, 1, 1, msg(b"q"))
    answer = await exchange(server.port, data, ended(1))
    assert status_of(answer, 1) == "12"


async def test_goaway_names_the_last_stream_processed() -> None:
    async with live_rls(_echo) as port:
        s = Server(port, RLS_PATH)
        data = s.headers(1) + frame(DATA, 1, 1, msg(b"q")) + s.headers(3)
        answer = await exchange(
            port, data, lambda fs: any(s == 3 for _, _, s, _ in fs) or ended(1)(fs)
        )
        answer = await exchange(port, data + frame(PUSH, 0x4, 1, b"\x00\x00\x00\x05"), gone)
        assert answer.goaway() == (3, PROTOCOL)


async def test_rapid_resets_go_away_with_enhance_your_calm(server: Server) -> None:
    cancel = struct.pack(">I", 8)
    data = b"".join(
        server.headers(2 * i + 1) + frame(RST, 0, 2 * i + 1, cancel) for i in range(1500)
    )
    answer = await exchange(server.port, data, gone)
    goaway = answer.goaway()
    assert goaway is not None and goaway[1] == CALM
