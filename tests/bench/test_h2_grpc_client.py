"""The benchmark's lean gRPC client against grpcio's own server (the reference): many calls
pipelined past the server's stream limit and its flow-control windows, answers matched to their
calls, error statuses raised."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from h2_grpc_client import MAX_MESSAGE, GrpcError, H2GrpcClient

from tests.helpers import free_port

METHOD = "/test.Echo/Call"


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request.startswith(b"fail"):
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "told to fail")
    await asyncio.sleep(random.random() * 0.002)  # answers out of order
    return request[::-1]


@pytest.fixture
async def server() -> AsyncIterator[int]:
    port = free_port()
    srv = grpc.aio.server(options=[("grpc.max_concurrent_streams", 16)])
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    srv.add_generic_rpc_handlers((handler,))
    srv.add_insecure_port(f"127.0.0.1:{port}")
    await srv.start()
    try:
        yield port
    finally:
        await srv.stop(None)


async def test_pipelined_calls_get_their_own_answers(server: int) -> None:
    client = await H2GrpcClient.connect("127.0.0.1", server, METHOD)
    rng = random.Random(7)
    messages = [rng.randbytes(rng.choice([0, 1, 100, 4000, MAX_MESSAGE])) for _ in range(600)]
    try:
        answers = await asyncio.wait_for(asyncio.gather(*(client.call(m) for m in messages)), 60)
    finally:
        client.close()
    assert answers == [m[::-1] for m in messages]  # 600 calls through 16 streams at a time


async def test_a_status_other_than_ok_is_an_error_and_the_connection_goes_on(server: int) -> None:
    client = await H2GrpcClient.connect("127.0.0.1", server, METHOD)
    try:
        with pytest.raises(GrpcError, match="grpc-status 8"):
            await client.call(b"fail please")
        assert await client.call(b"abc") == b"cba"
        with pytest.raises(ValueError, match="at most"):
            await client.call(b"x" * (MAX_MESSAGE + 1))
    finally:
        client.close()
