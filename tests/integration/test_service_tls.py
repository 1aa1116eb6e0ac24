"""mTLS between Envoy and the filter server / the rate-limit service, with real processes: the
control plane gives Envoy's ext_proc and rate-limit clusters a TLS transport socket with its
client certificate, both services serve TLS only (each transport), a request is served end to
end (the filter server authenticates it, the rate-limit service charges its budget), a client
without a certificate is refused in the handshake, and a service asked to listen beyond
loopback in clear refuses to start."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from controlplane.tls_material import CertPair, make_ca, make_cert
from tests.filters.fake_openai import FakeOpenAI
from tests.helpers import free_port
from tests.integration.mesh_harness import (
    mesh,
    mesh_policy,
    metered_route,
    service_processes,
    token_tier,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _tls(server: CertPair, ca: CertPair, envoy: CertPair) -> str:
    return (
        f"{{cert: {server.cert}, key: {server.key}, ca: {ca.cert}, "
        f"client_cert: {envoy.cert}, client_key: {envoy.key}}}"
    )


def _policy(gw: int, fp: int, rp: int, redis_url: str, backend: int, tls: str) -> str:
    return mesh_policy(
        gw=gw, fp=fp, rp=rp, redis_url=redis_url, ratelimit=f", tls: {tls}",
        ratelimit_timeout="2s", filters=f"message_timeout: 2s, tls: {tls}",
        pools={"chat": ("m1", backend)}, rest=token_tier(1000, {"carol": "carol-key-123"}),
        routes=[metered_route(plugins="identity, tokens, lane, usage")],
    )  # fmt: skip


async def _handshake(port: int, ctx: ssl.SSLContext) -> str | None:
    """The ALPN protocol of a completed TLS 1.3 session (the server's verdict on the client
    certificate arrives with the first read)."""
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="svc")
    try:
        w.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000"))
        await w.drain()
        await asyncio.wait_for(r.readexactly(9), 5)  # the server's SETTINGS frame
        return str(w.get_extra_info("ssl_object").selected_alpn_protocol())
    finally:
        w.close()


def _client(ca: CertPair, cert: CertPair | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    ctx.check_hostname = False
    ctx.set_alpn_protocols(["h2"])
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


@pytest.mark.parametrize("transport", ["h2", "grpc"])
async def test_envoy_speaks_mtls_to_filters_and_ratelimit(
    tmp_path: Path, redis_port: int, transport: str
) -> None:
    ca = make_ca(tmp_path / "ca")
    server = make_cert(tmp_path / "svc", "svc", ca, ips=("127.0.0.1",))
    envoy = make_cert(tmp_path / "envoy", "envoy", ca, client=True)
    stranger_ca = make_ca(tmp_path / "other", "other-ca")
    stranger = make_cert(tmp_path / "other", "stranger", stranger_ca, client=True)
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    backend = FakeOpenAI(name="b0")
    await backend.start()
    gw, fp, rp = free_port(), free_port(), free_port()
    text = _policy(gw, fp, rp, redis_url, backend.port, _tls(server, ca, envoy))
    ports = {"ratelimit_service": rp, "filters": fp}
    extra = {mod: ["--transport", transport] for mod in ports}
    try:
        async with (
            mesh(tmp_path, text, {"edge": gw}) as m,
            service_processes(tmp_path, m.policy_path, redis_url, ports, extra=extra),
        ):
            clusters = await m.clusters_text("edge")
            assert "tokenweir_filters" in clusters and "tokenweir_ratelimit" in clusters

            body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
            url = f"http://127.0.0.1:{gw}/v1/chat/completions"
            async with aiohttp.ClientSession() as s:
                async with s.post(url, json=body, headers={"authorization": "Bearer nope"}) as a:
                    assert a.status == 401, await a.text()  # the filter server answered
                headers = {"authorization": "Bearer carol-key-123"}
                async with s.post(url, json=body, headers=headers) as a:
                    assert a.status == 200, await a.text()
                    assert json.loads(await a.read())["usage"]["total_tokens"] > 0
            assert len(backend.seen) == 1
            assert [k async for k in r.scan_iter("tw:{carol}*")], "no budget was charged"

            for port in (fp, rp):
                assert await _handshake(port, _client(ca, envoy)) == "h2"
                for who in (None, stranger):  # no certificate; one from another CA
                    with pytest.raises(
                        (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)
                    ):
                        await _handshake(port, _client(ca, who))
    finally:
        await backend.aclose()
        await r.aclose()


@pytest.mark.parametrize("module", ["filters", "ratelimit_service"])
def test_plaintext_beyond_loopback_refused_at_start(tmp_path: Path, module: str) -> None:
    policy = tmp_path / "mesh.yaml"
    policy.write_text("version: 1\npools: {chat: {models: [m], endpoints: [127.0.0.1:1]}}\n")
    argv = [sys.executable, "-m", module, "--policy", str(policy),
            "--listen", f"0.0.0.0:{free_port()}", "--redis-url", "redis://127.0.0.1:1/0"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    section = "filters" if module == "filters" else "ratelimit"
    assert f"{section} would listen on 0.0.0.0 without TLS" in done.stderr, done.stderr[-2000:]
    assert f"{section}.allow_plaintext: true" in done.stderr
