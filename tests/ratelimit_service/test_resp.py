"""The RESP fast path only where it is safe: plain ``redis://`` over TCP. ``rediss://`` and
``unix://`` go through redis-py; a Redis that stops answering is dropped after the read timeout
(the documented Redis-down behaviour within the deadline, then a fresh connection)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ratelimit_service.errors import StoreUnavailable
from ratelimit_service.limiter import Check
from ratelimit_service.resp import RespConnection, fast_path_url
from ratelimit_service.store import RedisStore
from runtime.redis_connect import connect_redis
from tests.helpers import redis_server


def test_fast_path_url_takes_redis_and_rediss_over_tcp() -> None:
    assert fast_path_url("redis://:pw@127.0.0.1:6380/2?cluster=0") == "redis://:pw@127.0.0.1:6380/2"
    tls = "rediss://u:pw@127.0.0.1:6380/0?ssl_ca_certs=/ca.pem"
    assert fast_path_url(tls) == tls  # the query holds the TLS settings
    for url in ("unix:///tmp/r.sock", "redis+sentinel://x", ""):
        assert fast_path_url(url) is None
    with pytest.raises(ValueError, match="redis:// and rediss:// only"):
        RespConnection("unix:///tmp/r.sock")


class FakeRedis:
    """Answers every command with an empty array — until told to stop answering (stalled)."""

    def __init__(self) -> None:
        self.stalled = False
        self.received = bytearray()
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeRedis:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(OSError):
            while data := await reader.read(1 << 16):
                self.received += data
                if not self.stalled:
                    writer.write(b"*0\r\n" * data.count(b"*2\r\n"))  # one reply per HGETALL
        writer.close()


async def test_a_stalled_socket_is_dropped_after_the_read_timeout() -> None:
    async with FakeRedis() as fake:
        conn = RespConnection(f"redis://127.0.0.1:{fake.port}/0", read_timeout=0.2)
        assert await conn.execute([("HGETALL", "k")]) == [[]]
        fake.stalled = True
        with pytest.raises(TimeoutError, match="did not answer"):
            await asyncio.wait_for(conn.execute([("HGETALL", "k")]), 5)
        fake.stalled = False
        assert await conn.execute([("HGETALL", "k")]) == [[]]  # a fresh connection
        assert fake.connections == 2
        await conn.close()


async def test_a_stalled_redis_does_not_pin_the_store_pipelines() -> None:
    async with FakeRedis() as fake:
        store = RedisStore(None, deadline=0.05, fast_url=f"redis://127.0.0.1:{fake.port}/0")
        fake.stalled = True
        for _ in range(4):  # more stalled batches than pipelines
            with pytest.raises(TimeoutError):
                await store.hgetall("tw:{x}:q")
        fake.stalled = False
        answered = False
        for _ in range(60):  # the stalled round trips end after 2 x deadline; then it answers
            try:
                answered = await store.hgetall("tw:{x}:q") == {}
                break
            except (TimeoutError, StoreUnavailable):
                await asyncio.sleep(0.05)
        assert answered
        await store.aclose()


async def test_rediss_never_sends_the_password_in_cleartext() -> None:
    async with FakeRedis() as fake:
        url = f"rediss://:hunter2secret@127.0.0.1:{fake.port}/0"
        client = aioredis.Redis.from_url(url, ssl_cert_reqs="none", socket_timeout=0.3)
        store = RedisStore(client, deadline=0.5, fast_url=url)
        with pytest.raises((StoreUnavailable, TimeoutError)):
            await store.hgetall("tw:{x}:q")
        await store.aclose()
        await client.aclose()
        assert fake.received and b"hunter2secret" not in fake.received


@contextlib.asynccontextmanager
async def unix_redis() -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="tw-sock-") as tmp:
        sock = Path(tmp) / "redis.sock"
        with redis_server(["--unixsocket", str(sock), "--unixsocketperm", "700"]):
            for _ in range(100):
                if sock.exists():
                    break
                await asyncio.sleep(0.02)
            yield f"unix://{sock}"


async def test_unix_socket_urls_go_through_redis_py_to_that_socket() -> None:
    async with unix_redis() as url:
        client = await connect_redis(url)
        store = RedisStore(client, deadline=2.0, fast_url=url)
        t = uuid.uuid4().hex
        check = Check(f"tw:{{{t}}}:b:tokens", "b", 100, 1000, 0.0, 0, False, True)
        result = await store.reserve(f"tw:{{{t}}}:r:1", True, [check], int(time.time() * 1e6), 1000)
        assert result.admitted
        assert await client.exists(f"tw:{{{t}}}:r:1") == 1  # written through the unix socket
        await store.aclose()
        await client.aclose()
