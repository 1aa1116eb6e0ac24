"""``filters.tls`` / ``ratelimit.tls``: each bad file a ``file:line: key: what`` error; good
ones made absolute and rendered into the ext_proc and rate-limit clusters' TLS transport socket
(Envoy's client certificate, the CA, ALPN h2); the start-up rule against plaintext beyond
loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from controlplane.tls_material import make_ca, make_cert
from controlplane.translate.render import render
from controlplane.xds.types import CLUSTER
from policy import PolicyError, load_policy
from runtime.errors import PlaintextRefused
from runtime.h2 import transport_for
from runtime.tls_server import ServerTlsFiles, check_plaintext, server_context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "ca")
    make_cert(d, "svc", ca, ips=("127.0.0.1",))
    make_cert(d, "envoy", ca, client=True)
    return d


def _write(tmp: Path, tls: str) -> Path:
    p = tmp / "mesh.yaml"
    p.write_text(
        "version: 1\n"
        "ratelimit:\n"
        "  address: 127.0.0.1:18081\n"
        f"  tls: {tls}\n"
        "filters:\n"
        "  address: 127.0.0.1:18082\n"
        f"  tls: {tls}\n"
        "pools:\n  chat: {models: [m], endpoints: [127.0.0.1:9]}\n"
        "gateways:\n  edge:\n    routes:\n"
        "      - {name: chat, pool: chat, rate_limit: {enabled: true},"
        " filters: {plugins: [identity]}}\n"
    )
    return p


def _tls(d: Path, **over: str) -> str:
    keys = {"cert": "svc.crt", "key": "svc.key", "ca": "ca.crt"}
    keys |= {"client_cert": "envoy.crt", "client_key": "envoy.key", **over}
    return "{" + ", ".join(f"{k}: {d}/{v}" for k, v in keys.items()) + "}"


def test_missing_and_mismatched_files_are_refused_on_their_lines(tmp_path: Path, pki: Path) -> None:
    p = _write(tmp_path, _tls(pki, key="envoy.key", client_cert="none.crt"))
    with pytest.raises(PolicyError) as info:
        load_policy(p)
    msg = str(info.value)
    assert f"{p}:4: ratelimit.tls.key:" in msg and "does not match the certificate" in msg
    assert f"{p}:7: filters.tls.client_cert: cannot read {pki}/none.crt" in msg


def test_clusters_get_envoys_client_certificate_and_the_ca(tmp_path: Path, pki: Path) -> None:
    policy = load_policy(_write(tmp_path, _tls(pki)))
    clusters = render(policy)["edge"][CLUSTER]
    for name in ("tokenweir_filters", "tokenweir_ratelimit"):
        socket = clusters[name].transport_socket
        assert socket.name == "envoy.transport_sockets.tls"
        ctx = tls_pb2.UpstreamTlsContext()
        socket.typed_config.Unpack(ctx)
        common = ctx.common_tls_context
        assert common.validation_context.trusted_ca.filename == f"{pki}/ca.crt"
        assert common.tls_certificates[0].certificate_chain.filename == f"{pki}/envoy.crt"
        assert common.tls_certificates[0].private_key.filename == f"{pki}/envoy.key"
        assert list(common.alpn_protocols) == ["h2"]


def test_no_tls_no_transport_socket(tmp_path: Path) -> None:
    p = tmp_path / "mesh.yaml"
    p.write_text(
        "version: 1\nratelimit: {address: 127.0.0.1:18081}\nfilters: {address: 127.0.0.1:18082}\n"
        "pools:\n  chat: {models: [m], endpoints: [127.0.0.1:9]}\n"
        "gateways:\n  edge:\n    routes: [{name: chat, pool: chat, rate_limit: {enabled: true},"
        " filters: {plugins: [identity]}}]\n"
    )
    clusters = render(load_policy(p))["edge"][CLUSTER]
    assert not clusters["tokenweir_ratelimit"].HasField("transport_socket")
    assert not clusters["tokenweir_filters"].HasField("transport_socket")


def test_plaintext_beyond_loopback_needs_tls_or_consent(pki: Path) -> None:
    files = ServerTlsFiles(f"{pki}/svc.crt", f"{pki}/svc.key", f"{pki}/ca.crt")
    check_plaintext("filters", "127.0.0.1", None, False)
    check_plaintext("filters", "10.0.0.5", files, False)
    check_plaintext("filters", "0.0.0.0", None, True)
    with pytest.raises(PlaintextRefused, match=r"filters\.allow_plaintext: true"):
        check_plaintext("filters", "0.0.0.0", None, False)
    # the built-in h2 transport serves beyond loopback only behind TLS
    assert transport_for("h2", "0.0.0.0") == "grpc"
    assert transport_for("h2", "0.0.0.0", tls=True) == "h2"
    ctx = server_context(files)
    assert ctx.verify_mode.name == "CERT_REQUIRED"
    assert ctx.minimum_version.name == "TLSv1_2"
