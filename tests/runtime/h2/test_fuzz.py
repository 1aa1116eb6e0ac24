"""Hypothesis-generated frame sequences against LIVE servers of both services: no crash (no
INTERNAL_ERROR, nothing escaping), bounded state, only the RFC's error codes, GOAWAY naming a
stream the client opened, and the server still answering afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hpack import Encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filters.h2server import PROCESS_PATH, H2FilterServer
from ratelimit_service.h2server import SHOULD_RATE_LIMIT_PATH, H2Server
from runtime.h2 import GrpcH2Server, Limits
from tests.runtime.h2.test_clients import Echo
from tests.runtime.h2.wire import frames

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Live:
    """A server on its own event loop thread (hypothesis examples are synchronous)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.path = SHOULD_RATE_LIMIT_PATH if kind == "rls" else PROCESS_PATH
        self.grpc: GrpcH2Server = self._call(self._start())

    async def _start(self) -> GrpcH2Server:
        async def echo(m: bytes) -> bytes:
            return m

        if self.kind == "rls":
            server: Any = H2Server(echo)
            await server.start("127.0.0.1", 0)
            return server  # type: ignore[no-any-return]
        fs = H2FilterServer(Echo(), "127.0.0.1", 0)  # type: ignore[arg-type]
        await fs.start()
        return fs.grpc

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self._call(self.grpc.aclose(0.1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module", params=["rls", "filters"])
def live(request: pytest.FixtureRequest) -> Iterator[Live]:
    server = Live(request.param)
    yield server
    server.close()


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes((kind, flags)) + struct.pack(">I", stream) + payload
    )


streams = st.sampled_from([0, 1, 2, 3, 5, 7, 9, 0x7FFFFFFF])
raw = st.tuples(st.integers(0, 12), st.integers(0, 255), streams, st.binary(max_size=48)).map(
    lambda t: frame(*t)
)
grpc_data = st.tuples(streams, st.binary(max_size=32), st.booleans()).map(
    lambda t: frame(0, int(t[2]), t[0], b"\x00" + len(t[1]).to_bytes(4, "big") + t[1])
)
settings_frames = st.lists(
    st.tuples(st.integers(0, 8), st.integers(0, 0xFFFFFFFF)), max_size=4
).map(lambda kv: frame(4, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in kv)))
window = st.tuples(streams, st.integers(0, 0xFFFFFFFF)).map(
    lambda t: frame(8, 0, t[0], struct.pack(">I", t[1]))
)
opens = st.tuples(st.sampled_from([1, 3, 5, 7, 9]), st.integers(0, 0x2F), st.booleans())


def _scenario(path: str) -> st.SearchStrategy[list[bytes]]:
    def headers(t: tuple[int, int, bool]) -> bytes:
        sid, flags, timeout = t
        hs = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x")]
        if timeout:
            hs.append(("grpc-timeout", "1m"))
        return frame(1, flags | 0x4, sid, bytes(Encoder().encode(hs)))

    one = st.one_of(raw, grpc_data, settings_frames, window, opens.map(headers))
    return st.lists(one, max_size=24)


def _exchange(live: Live, chunks: list[bytes]) -> list[tuple[int, int, int, bytes]]:
    with socket.create_connection(("127.0.0.1", live.grpc.port), timeout=5) as sock:
        marker = b"fuzzdone"
        payload = PREFACE + frame(4, 0, 0, b"") + b"".join(chunks) + frame(6, 0, 0, marker)
        with contextlib.suppress(OSError):
            sock.sendall(payload)
        got = bytearray()
        while True:
            fs = frames(_whole(got))
            if any(k == 6 and p == marker for k, _, _, p in fs) or any(k == 7 for k, *_ in fs):
                break
            try:
                chunk = sock.recv(1 << 16)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        _bounded(live)
        return frames(_whole(got))


def _whole(data: bytearray) -> bytes:
    pos = 0
    while len(data) - pos >= 9 and len(data) - pos >= 9 + int.from_bytes(data[pos : pos + 3]):
        pos += 9 + int.from_bytes(data[pos : pos + 3])
    return bytes(data[:pos])


def _bounded(live: Live) -> None:
    lim = Limits()
    for conn in list(live.grpc.conns):
        assert len(conn.buf) <= lim.max_frame_size + 9
        assert conn.buffered <= lim.max_buffered + lim.max_message
        assert len(conn.streams) <= lim.max_concurrent_streams


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_frame_sequences(live: Live, data: st.DataObject) -> None:
    chunks = data.draw(_scenario(live.path))
    out = _exchange(live, chunks)
    for kind, _, _sid, payload in out:
        if kind == 7:
            last, code = struct.unpack(">II", payload[:8])
            assert code in (1, 3, 5, 6, 9, 11), code  # never INTERNAL_ERROR
            assert last in (0, 1, 3, 5, 7, 9)
        elif kind == 3:
            assert struct.unpack(">I", payload)[0] in (0, 1, 3, 5, 6, 7, 8), payload


def test_server_still_answers_after_the_fuzzing(live: Live) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{live.grpc.port}") as ch:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
