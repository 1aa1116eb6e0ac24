"""``tokenweir status`` without a running mesh: says so and how to start one (was a bare
``Connection refused``); against a control plane that serves HTTPS with client certificates."""

from __future__ import annotations

import asyncio
import urllib.error
from pathlib import Path

import pytest

from controlplane.app import ControlPlane, ControlPlaneSettings
from controlplane.tls_material import make_ca, make_cert
from policy import Address
from runtime.admin_auth import (
    CLIENT_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    AdminTls,
)
from tests.helpers import free_port
from tokenweir import status_cli
from tokenweir.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _refused(url: str, context: object = None) -> object:
    raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))


def test_status_without_a_mesh_says_none_runs_and_how_to_start_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(status_cli, "_get", _refused)
    policy = ROOT / "examples" / "mesh.yaml"
    assert main(["status", "-c", str(policy)]) == 1
    assert capsys.readouterr().err == (
        "tokenweir status: no mesh is running: nothing listens on http://127.0.0.1:18001 "
        f"(control_plane.metrics of {policy}); start one with `tokenweir up -c {policy}`\n"
    )


def test_status_names_the_flag_it_was_given_and_other_errors_stay_as_they_are(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(status_cli, "_get", _refused)
    assert main(["status", "--control-plane", "127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "no mesh is running: nothing listens on http://127.0.0.1:9 (--control-plane)" in err
    assert "`tokenweir up -c mesh.yaml`" in err

    def timeout(url: str, context: object = None) -> object:
        raise urllib.error.URLError(TimeoutError("timed out"))

    monkeypatch.setattr(status_cli, "_get", timeout)
    assert main(["status", "--control-plane", "127.0.0.1:9"]) == 1
    assert (
        capsys.readouterr().err == "tokenweir status: cannot read http://127.0.0.1:9: timed out\n"
    )


async def test_status_reads_an_https_control_plane_with_the_operators_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator surface over HTTPS with client certificates (docs/production.md): the CLI
    speaks HTTPS, checks the server against the mesh CA and is let in by its certificate alone
    (no token set); one of another CA is refused in the handshake, and plain HTTP gets nothing."""
    ca = make_ca(tmp_path / "ca")
    other = make_ca(tmp_path / "other", "other-ca")
    server = make_cert(tmp_path / "srv", "control-plane", ca, ips=("127.0.0.1",))
    operator = make_cert(tmp_path / "op", "operator", ca, client=True)
    stranger = make_cert(tmp_path / "st", "stranger", other, client=True)
    policy = tmp_path / "mesh.yaml"
    policy.write_text("version: 1\npools: {chat: {models: [m], endpoints: [127.0.0.1:9]}}\n")
    metrics = free_port()
    plane = ControlPlane(
        ControlPlaneSettings(
            policy,
            Address("127.0.0.1", free_port()),
            Address("127.0.0.1", metrics),
            debounce=0.05,
            admin_token="a-long-enough-admin-token-0123456789",
            admin_tls=AdminTls(str(server.cert), str(server.key), str(ca.cert)),
        )
    )
    assert (await plane.start()).ok
    argv = ["status", "--control-plane", f"127.0.0.1:{metrics}"]
    for name in (TOKEN_ENV, TOKEN_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    try:
        monkeypatch.setenv(CLIENT_CA_ENV, str(ca.cert))
        monkeypatch.setenv(TLS_CERT_ENV, str(operator.cert))
        monkeypatch.setenv(TLS_KEY_ENV, str(operator.key))
        assert await asyncio.to_thread(main, argv) == 0
        assert "no pool has a canary" in capsys.readouterr().out

        monkeypatch.setenv(TLS_CERT_ENV, str(stranger.cert))
        monkeypatch.setenv(TLS_KEY_ENV, str(stranger.key))
        assert await asyncio.to_thread(main, argv) == 1
        assert f"cannot read https://127.0.0.1:{metrics}" in capsys.readouterr().err

        for name in (CLIENT_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV):
            monkeypatch.delenv(name)
        assert await asyncio.to_thread(main, argv) == 1  # plain HTTP to an HTTPS-only surface
        assert f"cannot read http://127.0.0.1:{metrics}" in capsys.readouterr().err

        monkeypatch.setenv(TLS_CERT_ENV, str(operator.cert))  # the key missing: said, exit 2
        assert await asyncio.to_thread(main, argv) == 2
        assert f"set {TLS_CERT_ENV} and {TLS_KEY_ENV} together" in capsys.readouterr().err
    finally:
        await plane.aclose()
