"""``runtime.h2`` against real clients: grpcio (unary, bidi streaming, health, deadlines,
message limits, graceful close) and the ``h2`` library as a conformance client."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from filters.h2server import PROCESS_PATH, H2FilterServer
from ratelimit_service.h2server import SHOULD_RATE_LIMIT_PATH, H2Server
from runtime.h2 import GrpcH2Server, Method, Stream
from runtime.health import HealthState
from tests.runtime.h2.test_defects import Hanging


async def _echo(m: bytes) -> bytes:
    return m[::-1]


@contextlib.asynccontextmanager
async def rls(health: HealthState | None = None) -> AsyncIterator[tuple[H2Server, str]]:
    server = H2Server(_echo, health=health)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        await server.aclose(0.1)


async def test_grpcio_unary_calls_messages_limits_and_deadlines() -> None:
    async with rls() as (_, target), grpc.aio.insecure_channel(target) as ch:
        rpc = ch.unary_unary(SHOULD_RATE_LIMIT_PATH)
        assert await rpc(b"abc", timeout=5) == b"cba"
        big = b"m" * (3 * 1024 * 1024)  # flow control both ways, many frames
        assert await rpc(big, timeout=10) == big
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await rpc(b"m" * (5 * 1024 * 1024), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary("/other.Service/Method")(b"x", timeout=5)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_grpcio_deadline_cancels_the_method() -> None:
    cancelled = asyncio.Event()

    async def slow(_: bytes) -> bytes:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return b""

    server = H2Server(slow)
    port = await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary(SHOULD_RATE_LIMIT_PATH)(b"x", timeout=0.2)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(cancelled.wait(), 5)
    finally:
        await server.aclose(0.1)


class Echo:
    async def Process(self, _: object, ctx: object) -> None:
        from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

        from filters.h2stream import EOF

        while (req := await ctx.read()) is not EOF:  # type: ignore[attr-defined]
            n = len(req.request_body.body)
            resp = pb.ProcessingResponse(request_body=pb.BodyResponse())
            resp.request_body.response.body_mutation.body = b"x" * n
            await ctx.write(resp)  # type: ignore[attr-defined]


async def test_grpcio_bidi_ext_proc_stream() -> None:
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    server = H2FilterServer(Echo(), "127.0.0.1", 0)  # type: ignore[arg-type]
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            call = ch.stream_stream(
                PROCESS_PATH,
                request_serializer=pb.ProcessingRequest.SerializeToString,
                response_deserializer=pb.ProcessingResponse.FromString,
            )(metadata=[("x-tokenweir-route", "chat")], timeout=10)
            for n in (1, 1000, 200_000):
                await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=b"b" * n)))
                resp = await call.read()
                assert len(resp.request_body.response.body_mutation.body) == n
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
    finally:
        await server.aclose(0.1)


@pytest.mark.parametrize("kind", ["rls", "filters"])
async def test_health_check_on_both_servers(kind: str) -> None:
    health = HealthState(["envoy.service.ratelimit.v3.RateLimitService"])
    server: H2Server | H2FilterServer
    if kind == "rls":
        server = H2Server(_echo, health=health)
        port = await server.start("127.0.0.1", 0)
    else:
        server = H2FilterServer(Hanging(), "127.0.0.1", 0, health=health)  # type: ignore[arg-type]
        await server.start()
        port = server.port
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            ok = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert ok.status == health_pb2.HealthCheckResponse.SERVING
            health.shutdown()
            named = health_pb2.HealthCheckRequest(
                service="envoy.service.ratelimit.v3.RateLimitService"
            )
            down = await stub.Check(named, timeout=5)
            assert down.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.aclose(0.1)


async def test_aclose_lets_calls_in_flight_finish_and_refuses_new_ones() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def held(m: bytes) -> bytes:
        started.set()
        await release.wait()
        return m

    server = H2Server(held)
    port = await server.start("127.0.0.1", 0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = asyncio.ensure_future(ch.unary_unary(SHOULD_RATE_LIMIT_PATH)(b"in", timeout=10))
        await asyncio.wait_for(started.wait(), 5)
        closing = asyncio.ensure_future(server.aclose(grace=10))
        await asyncio.sleep(0.05)
        assert not closing.done()  # waiting for the call in flight
        release.set()
        assert await call == b"in"
        await asyncio.wait_for(closing, 5)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


async def test_aclose_cancels_what_outlives_the_grace() -> None:
    async with rls() as (server, target), grpc.aio.insecure_channel(target) as ch:
        server.methods[SHOULD_RATE_LIMIT_PATH] = Method(unary=Hanging_unary)
        call = asyncio.ensure_future(ch.unary_unary(SHOULD_RATE_LIMIT_PATH)(b"x", timeout=10))
        await asyncio.sleep(0.1)
        await server.aclose(grace=0.05)
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        assert not server.tasks


async def Hanging_unary(_: bytes) -> bytes:
    await asyncio.Event().wait()
    return b""


async def test_the_builtin_transport_serves_loopback_only() -> None:
    server = GrpcH2Server({})
    for host in ("0.0.0.0", "10.1.2.3", "::", "example.com"):
        with pytest.raises(ValueError, match="loopback"):
            await server.start(host, 0)


def _h2_call(port: int, path: str, body: bytes) -> tuple[dict[str, str], bytes, dict[str, str]]:
    """One gRPC call with the ``h2`` library, which validates every frame it receives."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path)]
    headers += [(":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")]
    conn.send_headers(sid, headers)
    pending = b"\x00" + len(body).to_bytes(4, "big") + body
    resp: dict[str, str] = {}
    data, trailers = bytearray(), {}
    ended = False
    conn.ping(b"12345678")
    while not ended:
        while pending:
            n = min(len(pending), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if n <= 0:
                break
            conn.send_data(sid, pending[:n], end_stream=len(pending) == n)
            pending = pending[n:]
        sock.sendall(conn.data_to_send())
        chunk = sock.recv(1 << 16)
        assert chunk, "closed by the server"
        for ev in conn.receive_data(chunk):
            if isinstance(ev, h2.events.ResponseReceived):
                resp = {k.decode(): v.decode() for k, v in ev.headers}
            elif isinstance(ev, h2.events.DataReceived):
                data += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            elif isinstance(ev, h2.events.TrailersReceived):
                trailers = {k.decode(): v.decode() for k, v in ev.headers}
            elif isinstance(ev, h2.events.StreamEnded):
                ended = True
        sock.sendall(conn.data_to_send())
    conn.close_connection()
    sock.sendall(conn.data_to_send())
    sock.close()
    return resp, bytes(data[5:]), trailers


async def test_h2_library_as_conformance_client() -> None:
    async with rls() as (server, _):
        loop = asyncio.get_running_loop()
        body = b"q" * (2 * 1024 * 1024 + 7)  # beyond the stream window: needs our updates
        resp, data, trailers = await loop.run_in_executor(
            None, _h2_call, server.port, SHOULD_RATE_LIMIT_PATH, body
        )
        assert resp[":status"] == "200" and data == body[::-1] and trailers["grpc-status"] == "0"
        resp, data, trailers = await loop.run_in_executor(
            None, _h2_call, server.port, "/grpc.health.v1.Health/Check", b""
        )
        assert health_pb2.HealthCheckResponse.FromString(data).status == 1
        _, _, trailers = await loop.run_in_executor(None, _h2_call, server.port, "/x/y", b"")
        assert trailers.get("grpc-status") == "12" or resp


async def test_stream_api_reads_messages_in_order() -> None:
    got: list[bytes] = []

    async def collect(s: Stream) -> None:
        while (m := await s.read()) is not None:
            got.append(m)
        await s.write(b"%d" % len(got))

    server = GrpcH2Server({"/t.T/C": Method(streaming=collect)})
    port = await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:

            async def gen() -> AsyncIterator[bytes]:
                for i in range(5):
                    yield b"m%d" % i

            reply = await ch.stream_unary("/t.T/C")(gen(), timeout=5)
            assert reply == b"5" and got == [b"m%d" % i for i in range(5)]
    finally:
        await server.aclose(0.1)


def test_services_switch_to_grpc_aio_off_loopback() -> None:
    from runtime.h2 import transport_for

    assert transport_for("h2", "127.0.0.1") == "h2" and transport_for("h2", "::1") == "h2"
    assert transport_for("h2", "localhost") == "h2"
    assert transport_for("h2", "0.0.0.0") == "grpc" and transport_for("h2", "10.0.0.5") == "grpc"
    assert transport_for("grpc", "127.0.0.1") == "grpc"
