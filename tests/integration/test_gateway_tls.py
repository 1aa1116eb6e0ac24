"""HTTPS at the gateway, with a real Envoy: handshake and ALPN, a certificate per server name,
plain HTTP refused, a certificate renewed under traffic without one failed request, expired and
unknown certificates refused, and mTLS (the verified client certificate reaches the backend as
``x-forwarded-client-cert``, a client-sent one never does)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from controlplane.tls_material import CertPair, make_ca, make_cert
from tests.helpers import free_port
from tests.integration.mesh_harness import close_backends, mesh, start_backends

pytestmark = pytest.mark.integration
H1 = ("http/1.1",)


def _policy(gw: int, backend: int, tls: str) -> str:
    return f"""
version: 1
pools:
  chat: {{models: [m], endpoints: [127.0.0.1:{backend}], health_check: {{enabled: false}}}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes: [{{name: chat, pool: chat}}]
    tls: {tls}
"""


def _client(
    ca: Path, cert: CertPair | None = None, alpn: tuple[str, ...] = ("h2", "http/1.1")
) -> ssl.SSLContext:
    """``alpn``: aiohttp speaks HTTP/1.1 only, so its contexts offer only that."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(list(alpn))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


async def _handshake(port: int, ctx: ssl.SSLContext, name: str) -> tuple[str, str | None]:
    """(server certificate CN, ALPN chosen) of one TLS connection."""
    _, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=name)
    try:
        obj = w.get_extra_info("ssl_object")
        subject = dict(x[0] for x in obj.getpeercert()["subject"])
        return subject["commonName"], obj.selected_alpn_protocol()
    finally:
        w.close()


async def _get(
    session: aiohttp.ClientSession,
    port: int,
    ctx: ssl.SSLContext,
    name: str = "a.test",
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    async with session.get(
        f"https://127.0.0.1:{port}/v1/x",
        ssl=ctx,
        server_hostname=name,
        headers=headers or {},
        timeout=aiohttp.ClientTimeout(total=10),
    ) as r:
        return r.status, await r.text()


def _install(pair: CertPair, into: CertPair) -> None:
    """Renew as cert-manager does: write beside, then move into the watched directory."""
    for src, dst in ((pair.key, into.key), (pair.cert, into.cert)):
        tmp = dst.with_name(f".{dst.name}.new")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


async def test_https_by_sni_plain_http_refused_and_renewal_drops_nothing(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "ca")
    live = tmp_path / "live"
    a = make_cert(live, "a.test", ca, dns=("a.test",))
    b = make_cert(live, "b.test", ca, dns=("b.test",))
    renewed = make_cert(tmp_path / "next", "a.test-v2", ca, dns=("a.test",))
    (bs,) = await start_backends(1)
    gw = free_port()
    tls = (
        f"{{certificates: [{{cert: {a.cert}, key: {a.key}}}, "
        f"{{cert: {b.cert}, key: {b.key}, sni: [b.test]}}]}}"
    )
    client = _client(ca.cert)
    h1 = _client(ca.cert, alpn=("http/1.1",))
    try:
        async with mesh(tmp_path, _policy(gw, bs.port, tls), {"edge": gw}) as m:
            assert await _handshake(gw, client, "a.test") == ("a.test", "h2")
            assert (await _handshake(gw, client, "b.test"))[0] == "b.test"
            lax = _client(ca.cert)
            lax.check_hostname = False
            assert (await _handshake(gw, lax, "other.test"))[0] == "a.test"  # the default
            assert (await _handshake(gw, h1, "a.test"))[1] == "http/1.1"

            # plain HTTP on the TLS port: one clear 400, then the connection closes
            status, _, body = await m.get(gw, "/v1/x")
            assert status == 400 and json.loads(body)["error"]["code"] == "tls_required"
            assert bs.hits == 0

            async with aiohttp.ClientSession() as session:
                assert (await _get(session, gw, h1))[0] == 200
                # renewal under traffic: keep-alive and fresh connections, none may fail
                failures: list[str] = []
                ok = 0
                stop = asyncio.Event()

                async def load(fresh: bool) -> None:
                    nonlocal ok
                    s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=fresh))
                    try:
                        while not stop.is_set():
                            try:
                                status, _ = await _get(s, gw, h1)
                                ok += status == 200
                                if status != 200:
                                    failures.append(str(status))
                            except (aiohttp.ClientError, ssl.SSLError, OSError) as exc:
                                failures.append(repr(exc))
                    finally:
                        await s.close()

                workers = [asyncio.create_task(load(fresh)) for fresh in (False, True, True)]
                await asyncio.sleep(1.0)
                _install(renewed, a)
                seen = ""
                for _ in range(100):
                    seen, _alpn = await _handshake(gw, client, "a.test")
                    if seen == "a.test-v2":
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)
                stop.set()
                await asyncio.gather(*workers)
                assert seen == "a.test-v2", "the renewed certificate was not picked up"
                assert failures == [] and ok > 20, (failures[:5], ok)
                assert (await _handshake(gw, client, "b.test"))[0] == "b.test"

                # a policy naming a key of another certificate: refused, HTTPS keeps serving
                def errors() -> float:
                    value = m.plane.registry.get_sample_value(
                        "tokenweir_config_reloads_total", {"result": "error"}
                    )
                    return value or 0.0

                before = errors()
                text = _policy(gw, bs.port, tls.replace(f"key: {a.key}", f"key: {b.key}"))
                m.write_policy(text)
                for _ in range(100):
                    if errors() > before:
                        break
                    await asyncio.sleep(0.1)
                assert errors() > before, "the bad policy was not refused"
                assert (await _get(session, gw, h1))[0] == 200
                assert (await _handshake(gw, client, "a.test"))[0] == "a.test-v2"
    finally:
        await close_backends([bs])


async def test_expired_or_unknown_certificates_are_refused_and_mtls_names_the_client(
    tmp_path: Path,
) -> None:
    ca = make_ca(tmp_path / "ca")
    other_ca = make_ca(tmp_path / "other", "other-ca")
    live = tmp_path / "live"
    server = make_cert(live, "a.test", ca, dns=("a.test",))
    acme = make_cert(tmp_path / "clients", "acme", ca, client=True, uris=("spiffe://t/acme",))
    stale = make_cert(tmp_path / "clients", "stale", ca, client=True, expired=True)
    stranger = make_cert(tmp_path / "clients", "stranger", other_ca, client=True)
    (bs,) = await start_backends(1)
    gw = free_port()
    tls = (
        f"{{certificates: [{{cert: {server.cert}, key: {server.key}}}], "
        f"client_certificates: {{ca: {ca.cert}}}}}"
    )
    await asyncio.sleep(1.1)  # `stale` is past its notAfter
    try:
        async with (
            mesh(tmp_path, _policy(gw, bs.port, tls), {"edge": gw}),
            aiohttp.ClientSession() as session,
        ):
            # the server's certificate is checked by the client against its CA
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await _get(session, gw, _client(other_ca.cert, acme, H1))
            # no client certificate, an expired one, one of another CA: refused
            for who in (None, stale, stranger):
                with (
                    _who(who),
                    pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)),
                ):
                    await _get(session, gw, _client(ca.cert, who, H1))
            assert bs.hits == 0
            forged = {"x-forwarded-client-cert": 'Subject="CN=root";URI=spiffe://t/root'}
            status, _ = await _get(session, gw, _client(ca.cert, acme, H1), headers=forged)
            assert status == 200
            xfcc = bs.seen_headers[-1]["x-forwarded-client-cert"]
            assert 'Subject="CN=acme"' in xfcc and "URI=spiffe://t/acme" in xfcc
            assert "root" not in xfcc
    finally:
        await close_backends([bs])


async def test_a_plain_gateway_strips_a_client_sent_certificate_header(tmp_path: Path) -> None:
    (bs,) = await start_backends(1)
    gw = free_port()
    text = _policy(gw, bs.port, "null")
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            status, _, _ = await m.get(gw, "/v1/x", {"x-forwarded-client-cert": 'Subject="CN=x"'})
            assert status == 200
            assert "x-forwarded-client-cert" not in bs.seen_headers[-1]
    finally:
        await close_backends([bs])


@contextlib.contextmanager
def _who(who: CertPair | None) -> Iterator[None]:
    try:
        yield
    except pytest.fail.Exception as exc:
        raise AssertionError(f"{who.cert.name if who else 'no certificate'}: {exc}") from None


async def test_upstream_tls_with_ca_sni_and_client_certificate(tmp_path: Path) -> None:
    from aiohttp import web

    ca = make_ca(tmp_path / "ca")
    backend_cert = make_cert(tmp_path / "b", "sglang.internal", ca, dns=("sglang.internal",))
    envoy_client = make_cert(tmp_path / "c", "gateway", ca, client=True)
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        seen.append(dict(x[0] for x in peer["subject"])["commonName"] if peer else "")
        return web.Response(text="over tls")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.cert))
    server_ctx.load_cert_chain(str(backend_cert.cert), str(backend_cert.key))
    server_ctx.verify_mode = ssl.CERT_REQUIRED  # the backend wants the gateway's certificate
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_ctx).start()
    gw = free_port()
    good = f"{{ca: {ca.cert}, sni: sglang.internal, cert: {envoy_client.cert}, key: {envoy_client.key}}}"
    text = f"""
version: 1
pools:
  chat: {{models: [m], endpoints: [127.0.0.1:{port}], health_check: {{enabled: false}},
          retries: {{enabled: false}}, tls: {good}}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes: [{{name: chat, pool: chat}}]
"""
    try:
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            status, _, body = await m.get(gw, "/v1/x")
            assert (status, body) == (200, "over tls") and seen == ["gateway"]
            # a server name the backend's certificate does not carry: Envoy refuses it
            m.write_policy(text.replace("sni: sglang.internal", "sni: other.internal"))
            for _ in range(100):
                status, _, _ = await m.get(gw, "/v1/x")
                if status != 200:
                    break
                await asyncio.sleep(0.1)
            assert status == 503
    finally:
        await runner.cleanup()
