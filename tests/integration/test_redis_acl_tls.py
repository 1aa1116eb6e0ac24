"""Redis with an ACL user and TLS (Debian's redis-server has ``tls-port``), reached by every
client the mesh has: redis-py (``connect_redis``, the filter server's pool, ``tokenweir
quota``'s client), the rate-limit service's RESP fast path, and the start-up credential check
that turns a wrong password into one clear error."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import hiredis
import pytest
import redis

from controlplane.tls_material import make_ca, make_cert
from filters.redis_pool import redis_client
from ratelimit_service.resp import RespConnection, fast_path_url
from runtime.redis_connect import RedisAuthError, connect_redis, verify_credentials
from tests.helpers import LOOPBACK, ChildProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-password-for-tests"


@contextlib.contextmanager
def _tls_redis(tmp: Path) -> Iterator[tuple[int, int, Path]]:
    """(plain port, TLS port, CA file) of a redis-server whose only user is ``tw``."""
    ca = make_ca(tmp / "ca")
    server = make_cert(tmp / "srv", "redis", ca, dns=("localhost",), ips=("127.0.0.1",))
    conf = tmp / "acl.conf"
    conf.write_text(f"user default off\nuser tw on >{PASSWORD} ~* &* +@all\n")
    plain, tls = free_port(), free_port()
    argv = [
        shutil.which("redis-server") or "redis-server", str(conf),
        "--port", str(plain), "--tls-port", str(tls), "--bind", LOOPBACK,
        "--tls-cert-file", str(server.cert), "--tls-key-file", str(server.key),
        "--tls-ca-cert-file", str(ca.cert), "--tls-auth-clients", "no",
        "--save", "", "--appendonly", "no", "--dir", str(tmp),
    ]  # fmt: skip
    child = ChildProcess(argv, log=tmp / "redis.log")
    try:
        wait_for_port(plain)
        wait_for_port(tls)
        yield plain, tls, ca.cert
    finally:
        child.close()


async def test_acl_and_tls_on_every_client(tmp_path: Path) -> None:
    with _tls_redis(tmp_path) as (plain, tls, ca):
        # no password: NOAUTH, as `redis-cli ping` shows an operator
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=plain).ping()
        good = f"rediss://tw:{PASSWORD}@127.0.0.1:{tls}/0?ssl_ca_certs={ca}"
        await verify_credentials(good)
        client = await connect_redis(good)
        try:
            assert await client.set("k", "v") and await client.get("k") == b"v"
        finally:
            await client.aclose()
        pool = redis_client(good, timeout=1.0)
        try:
            assert await pool.get("k") == b"v"
        finally:
            await pool.aclose()
        sync = redis.Redis.from_url(good)  # what `tokenweir quota` / `keys` build
        assert sync.get("k") == b"v"
        sync.close()
        fast = fast_path_url(good)
        assert fast is not None
        conn = RespConnection(fast)
        try:
            assert await conn.execute([("GET", "k"), ("PING",)]) == [b"v", b"PONG"]
        finally:
            await conn.close()
        # plain TCP with the password works too; TLS with an unknown CA does not
        plain_url = f"redis://tw:{PASSWORD}@127.0.0.1:{plain}/0"
        conn = RespConnection(plain_url)
        try:
            assert await conn.execute([("GET", "k")]) == [b"v"]
        finally:
            await conn.close()
        other = make_ca(tmp_path / "other", "other-ca")
        conn = RespConnection(f"rediss://tw:{PASSWORD}@127.0.0.1:{tls}/0?ssl_ca_certs={other.cert}")
        with pytest.raises(OSError):  # ssl.SSLCertVerificationError
            await conn.execute([("PING",)])
        await conn.close()


@pytest.mark.parametrize("userinfo", ["tw:wrong-password", "", "nobody:" + PASSWORD])
async def test_wrong_credentials_are_one_clear_error_at_start(
    tmp_path: Path, userinfo: str
) -> None:
    with _tls_redis(tmp_path) as (plain, _tls, _ca):
        at = f"{userinfo}@" if userinfo else ""
        url = f"redis://{at}127.0.0.1:{plain}/0"
        with pytest.raises(RedisAuthError) as info:
            await connect_redis(url)
        message = str(info.value)
        assert "refused the credentials" in message
        assert "wrong-password" not in message and PASSWORD not in message  # redacted
        conn = RespConnection(url)
        try:  # the fast path: AUTH refused at connect, or (no password) NOAUTH as the reply
            (reply,) = await conn.execute([("PING",)])
            assert isinstance(reply, hiredis.ReplyError) and "NOAUTH" in str(reply)
        except ConnectionError as exc:
            assert "redis setup failed" in str(exc)
        finally:
            await conn.close()
