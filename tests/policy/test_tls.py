"""TLS files a policy names: each bad one is a ``file:line: key: what`` error; good ones are
made absolute and rendered into SNI filter chains and SDS files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.tls_material import make_ca, make_cert
from controlplane.translate.render import render
from controlplane.translate.tls import sds_documents
from controlplane.xds.types import LISTENER
from policy import PolicyError, load_policy


def _write(tmp: Path, tls: str) -> Path:
    p = tmp / "mesh.yaml"
    p.write_text(
        "version: 1\n"
        "pools:\n  chat: {models: [m], endpoints: [127.0.0.1:9]}\n"
        "gateways:\n  edge:\n    routes: [{name: chat, pool: chat}]\n"
        f"    tls:\n{tls}"
    )
    return p


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d)
    make_cert(d, "a", ca, dns=("a.test",))
    make_cert(d, "b", ca, dns=("b.test",))
    (d / "junk.pem").write_text("not a certificate\n")
    return d


def _error(path: Path) -> str:
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    return str(info.value)


def test_a_key_of_another_certificate_is_refused_on_its_line(tmp_path: Path, pki: Path) -> None:
    p = _write(
        tmp_path, f"      certificates:\n        - {{cert: {pki}/a.crt, key: {pki}/b.key}}\n"
    )
    msg = _error(p)
    assert f"{p}:9: gateways.edge.tls.certificates[0].key:" in msg
    assert "does not match the certificate" in msg


def test_missing_and_non_pem_files_are_refused(tmp_path: Path, pki: Path) -> None:
    p = _write(
        tmp_path,
        f"      certificates:\n        - {{cert: {pki}/none.crt, key: {pki}/junk.pem}}\n"
        f"      client_certificates: {{ca: missing-ca.pem}}\n",
    )
    msg = _error(p)
    assert "gateways.edge.tls.certificates[0].cert: cannot read" in msg and "none.crt" in msg
    assert "certificates[0].key:" in msg and "is not a PEM file" in msg
    assert f"{tmp_path}/missing-ca.pem" in msg and "client_certificates.ca" in msg


def test_a_server_name_given_twice_is_refused(tmp_path: Path, pki: Path) -> None:
    p = _write(
        tmp_path,
        f"      certificates:\n        - {{cert: {pki}/a.crt, key: {pki}/a.key, sni: [x.test]}}\n"
        f"        - {{cert: {pki}/b.crt, key: {pki}/b.key, sni: [x.test]}}\n",
    )
    assert "'x.test' is given twice" in _error(p)


def test_chains_by_sni_and_sds_files(tmp_path: Path, pki: Path) -> None:
    p = _write(
        tmp_path,
        f"      certificates:\n        - {{cert: {pki}/a.crt, key: {pki}/a.key}}\n"
        f"        - {{cert: {pki}/b.crt, key: {pki}/b.key, sni: [b.test]}}\n"
        "      sds_dir: sds\n",
    )
    policy = load_policy(p)
    tls = policy.gateways["edge"].tls
    assert tls is not None and tls.sds_dir == str(tmp_path / "sds")
    (listener,) = render(policy)["edge"][LISTENER].values()
    chains = [
        (list(c.filter_chain_match.server_names), c.filter_chain_match.transport_protocol)
        for c in listener.filter_chains
    ]
    assert chains == [(["b.test"], "tls"), ([], "tls"), ([], "raw_buffer")]
    assert listener.listener_filters[0].name == "envoy.filters.listener.tls_inspector"
    docs = sds_documents("edge", tls)
    assert sorted(docs) == [
        f"{tmp_path}/sds/tokenweir-tls-edge-0.yaml",
        f"{tmp_path}/sds/tokenweir-tls-edge-1.yaml",
    ]
    secret = json.loads(docs[f"{tmp_path}/sds/tokenweir-tls-edge-1.yaml"])["resources"][0]
    assert secret["tls_certificate"]["private_key"] == {"filename": f"{pki}/b.key"}
    assert secret["tls_certificate"]["watched_directory"] == {"path": str(pki)}
