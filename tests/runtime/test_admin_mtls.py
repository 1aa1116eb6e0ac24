"""mTLS on the operator surfaces (runtime.admin_auth): with a client CA, a verified client
certificate is let in without the token, a client without one still needs the token, a
certificate of another CA gets no connection; a bind beyond loopback is allowed with a client CA
alone; bad settings stop the start with the path. Also through the control plane's dashboard,
``/api/v1`` and ``/metrics``, and the filter server's pool-state reader over HTTPS."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from controlplane.app import ControlPlane, ControlPlaneSettings
from controlplane.tls_material import CertPair, make_ca, make_cert
from policy import Address
from poolstate.reader import PoolStateReader, pools_url
from runtime.admin_auth import (
    CLIENT_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    AdminAuthError,
    AdminTls,
    admin_tls,
)
from runtime.metrics_http import MetricsServer
from tests.helpers import free_port

TOKEN = "a-long-enough-admin-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CertPair]:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d / "ca")
    other = make_ca(d / "other", "other-ca")
    return {
        "ca": ca,
        "server": make_cert(d / "srv", "admin", ca, ips=("127.0.0.1",)),
        "client": make_cert(d / "cli", "prometheus", ca, client=True),
        "stranger": make_cert(d / "other", "stranger", other, client=True),
    }


def _tls(pki: dict[str, CertPair]) -> AdminTls:
    return AdminTls(str(pki["server"].cert), str(pki["server"].key), str(pki["ca"].cert))


def _client(pki: dict[str, CertPair], who: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"].cert))
    if who is not None:
        ctx.load_cert_chain(str(pki[who].cert), str(pki[who].key))
    return ctx


async def _status(url: str, ctx: ssl.SSLContext, headers: dict[str, str] | None = None) -> int:
    async with aiohttp.ClientSession() as s, s.get(url, ssl=ctx, headers=headers or {}) as r:
        return r.status


async def test_a_verified_client_certificate_stands_in_for_the_token(
    pki: dict[str, CertPair],
) -> None:
    server = MetricsServer(CollectorRegistry(), token=TOKEN, tls=_tls(pki))
    port = await server.start()
    url = f"https://127.0.0.1:{port}/metrics"
    try:
        assert await _status(url, _client(pki, "client")) == 200
        assert await _status(url, _client(pki, None)) == 401
        assert await _status(url, _client(pki, None), {"Authorization": f"Bearer {TOKEN}"}) == 200
        with pytest.raises(aiohttp.ClientError):  # another CA's certificate: no handshake
            await _status(url, _client(pki, "stranger"))
        with pytest.raises(aiohttp.ClientError):  # HTTPS only
            await _status(f"http://127.0.0.1:{port}/metrics", _client(pki, "client"))
    finally:
        await server.aclose()


async def test_client_ca_alone_guards_a_bind_beyond_loopback(pki: dict[str, CertPair]) -> None:
    server = MetricsServer(CollectorRegistry(), "0.0.0.0", 0, tls=_tls(pki))
    port = await server.start()
    try:
        assert await _status(f"https://127.0.0.1:{port}/metrics", _client(pki, "client")) == 200
        assert await _status(f"https://127.0.0.1:{port}/metrics", _client(pki, None)) == 401
        assert await _status(f"https://127.0.0.1:{port}/healthz", _client(pki, None)) == 200
    finally:
        await server.aclose()
    https_only = AdminTls(str(pki["server"].cert), str(pki["server"].key))  # no client CA
    with pytest.raises(AdminAuthError, match="without authentication"):
        await MetricsServer(CollectorRegistry(), "0.0.0.0", 0, tls=https_only).start()


def test_settings_from_the_environment(pki: dict[str, CertPair], tmp_path: Path) -> None:
    cert, key, ca = str(pki["server"].cert), str(pki["server"].key), str(pki["ca"].cert)
    assert admin_tls({}) is None
    assert admin_tls({TLS_CERT_ENV: cert, TLS_KEY_ENV: key, CLIENT_CA_ENV: ca}) == AdminTls(
        cert, key, ca
    )
    with pytest.raises(AdminAuthError, match="needs HTTPS"):
        admin_tls({CLIENT_CA_ENV: ca})
    with pytest.raises(AdminAuthError, match="together"):
        admin_tls({TLS_CERT_ENV: cert})
    with pytest.raises(AdminAuthError, match=r"missing\.pem"):
        admin_tls({TLS_CERT_ENV: cert, TLS_KEY_ENV: key, CLIENT_CA_ENV: f"{tmp_path}/missing.pem"})
    with pytest.raises(AdminAuthError, match=TLS_KEY_ENV):
        admin_tls({TLS_CERT_ENV: cert, TLS_KEY_ENV: str(pki["client"].key)})


async def test_control_plane_dashboard_and_pool_state_over_mtls(
    pki: dict[str, CertPair], tmp_path: Path
) -> None:
    policy = tmp_path / "mesh.yaml"
    policy.write_text("version: 1\npools: {chat: {models: [m], endpoints: [127.0.0.1:9]}}\n")
    metrics = free_port()
    plane = ControlPlane(
        ControlPlaneSettings(
            policy,
            Address("127.0.0.1", free_port()),
            Address("127.0.0.1", metrics),
            debounce=0.05,
            admin_token=TOKEN,
            admin_tls=_tls(pki),
        )
    )
    assert (await plane.start()).ok
    base = f"https://127.0.0.1:{metrics}"
    try:
        for path in ("/dashboard/", "/api/v1/pools", "/metrics"):
            assert await _status(base + path, _client(pki, "client")) == 200, path
            assert await _status(base + path, _client(pki, None)) == 401, path
        # the filter server's reader: HTTPS, the server checked against the mesh CA, the token
        reader = PoolStateReader(
            pools_url("127.0.0.1", metrics, https=True),
            clock=lambda: 0.0,
            token=TOKEN,
            ssl_context=_tls(pki).client(),
        )
        reader.start()
        try:
            assert await reader.first(5.0)
        finally:
            await reader.aclose()
    finally:
        await plane.aclose()
