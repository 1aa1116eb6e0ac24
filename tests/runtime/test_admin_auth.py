"""The operator surfaces: open on loopback, a token (bearer or HTTP Basic's password) required
when one is set, a bind beyond loopback without one refused, bad token sources refused."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from runtime.admin_auth import TOKEN_ENV, TOKEN_FILE_ENV, AdminAuthError, admin_token
from runtime.metrics_http import MetricsServer
from tokenweir.envoy_launcher import (
    EnvoyProcess,
    EnvoySettings,
    EnvoyStartError,
    render_bootstrap,
)

TOKEN = "a-long-enough-admin-token-0123456789"


async def test_a_token_is_required_on_every_path_but_healthz() -> None:
    server = MetricsServer(CollectorRegistry(), token=TOKEN)
    port = await server.start()
    base = f"http://127.0.0.1:{port}"
    basic = base64.b64encode(f"admin:{TOKEN}".encode()).decode()
    try:
        async with aiohttp.ClientSession() as s:
            for headers, want in (
                ({}, 401),
                ({"Authorization": "Bearer wrong-token-of-some-length"}, 401),
                ({"Authorization": f"Bearer {TOKEN}x"}, 401),
                ({"Authorization": "Basic !!!"}, 401),
                ({"Authorization": f"Bearer {TOKEN}"}, 200),
                ({"Authorization": f"Basic {basic}"}, 200),
            ):
                async with s.get(f"{base}/metrics", headers=headers) as r:
                    assert r.status == want, headers
                    if want == 401:
                        assert r.headers["WWW-Authenticate"].startswith("Basic")
            async with s.get(f"{base}/healthz") as r:
                assert r.status == 200
    finally:
        await server.aclose()


async def test_beyond_loopback_without_a_token_is_refused() -> None:
    server = MetricsServer(CollectorRegistry(), host="0.0.0.0")
    with pytest.raises(AdminAuthError, match="without authentication"):
        await server.start()
    server = MetricsServer(CollectorRegistry(), host="0.0.0.0", token=TOKEN)
    assert await server.start() > 0
    await server.aclose()


def test_token_sources(tmp_path: Path) -> None:
    assert admin_token({}) is None
    assert admin_token({TOKEN_ENV: f" {TOKEN}\n"}) == TOKEN
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    assert admin_token({TOKEN_FILE_ENV: str(f), TOKEN_ENV: "ignored-because-file-wins"}) == TOKEN
    with pytest.raises(AdminAuthError, match=f"cannot read {tmp_path}/missing"):
        admin_token({TOKEN_FILE_ENV: str(tmp_path / "missing")})
    f.chmod(0o000)
    if os.geteuid() != 0:  # root reads anything
        with pytest.raises(AdminAuthError, match="cannot read"):
            admin_token({TOKEN_FILE_ENV: str(f)})
    with pytest.raises(AdminAuthError, match="at least 16"):
        admin_token({TOKEN_ENV: "short"})


async def test_envoy_admin_stays_on_loopback(tmp_path: Path) -> None:
    wide = EnvoySettings(node_id="n", node_cluster="c", xds_port=1, base_id=1, admin_host="0.0.0.0")
    assert render_bootstrap(wide)["admin"]  # a pod's bootstrap: NetworkPolicy guards it
    with pytest.raises(EnvoyStartError, match="no authentication"):
        await EnvoyProcess(wide, tmp_path).start()
