"""A renewed certificate is served without a restart (runtime.tls_server.RenewingTls): the
built-in HTTP/2 transport and grpc.aio load it before the next connection's handshake, open
connections keep theirs, and a half-written or foreign renewal is refused, counted, and the old
certificate kept until the files change again."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
from pathlib import Path

import grpc
import pytest

from controlplane.tls_material import CertPair, make_ca, make_cert
from runtime.h2 import GrpcH2Server
from runtime.tls_server import RenewingTls, ServerTlsFiles
from tests.helpers import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _install(pair: CertPair, live: Path) -> None:
    """Rotate as cert-manager's writer does: new files renamed over the old ones."""
    for src, name in ((pair.cert, "tls.crt"), (pair.key, "tls.key")):
        tmp = live / f".{name}.new"
        shutil.copyfile(src, tmp)
        tmp.replace(live / name)


def _served_cn(port: int, ca: CertPair, client: CertPair) -> tuple[str, ssl.SSLSocket]:
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()  # a refused handshake leaves the plain socket open
        raise
    cert = sock.getpeercert()
    assert cert is not None
    subject = dict(x[0] for x in cert["subject"])
    return str(subject["commonName"]), sock


def _cn(port: int, ca: CertPair, client: CertPair) -> str:
    cn, sock = _served_cn(port, ca, client)
    sock.close()
    return cn


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, CertPair]:
    ca = make_ca(tmp_path / "ca")
    other = make_ca(tmp_path / "other", "other-ca")
    return {
        "ca": ca,
        "first": make_cert(tmp_path / "1", "first", ca, ips=("127.0.0.1",)),
        "second": make_cert(tmp_path / "2", "second", ca, ips=("127.0.0.1",)),
        "third": make_cert(tmp_path / "3", "third", ca, ips=("127.0.0.1",)),
        "foreign": make_cert(tmp_path / "f", "foreign", other, ips=("127.0.0.1",)),
        "client": make_cert(tmp_path / "c", "envoy", ca, client=True),
    }


def _renewing(pki: dict[str, CertPair], live: Path, clock: Clock, seen: list[bool]) -> RenewingTls:
    live.mkdir()
    _install(pki["first"], live)
    shutil.copyfile(pki["ca"].cert, live / "ca.crt")
    files = ServerTlsFiles(str(live / "tls.crt"), str(live / "tls.key"), str(live / "ca.crt"))
    return RenewingTls(files, on_reload=seen.append, clock=clock)


async def test_the_h2_transport_serves_a_renewed_certificate_without_a_restart(
    pki: dict[str, CertPair], tmp_path: Path
) -> None:
    clock, seen = Clock(), []  # type: ignore[var-annotated]  # filled by the callback
    renewing = _renewing(pki, tmp_path / "live", clock, seen)
    server = GrpcH2Server({})
    port = await server.start("127.0.0.1", free_port(), ssl=renewing.context,
                              before_handshake=renewing.refresh)  # fmt: skip
    ca, client = pki["ca"], pki["client"]
    first = second = None
    try:
        cn, first = await asyncio.to_thread(_served_cn, port, ca, client)
        assert cn == "first"

        _install(pki["second"], tmp_path / "live")
        clock.now += 0.5  # looked at most once a second: not yet
        assert await asyncio.to_thread(_cn, port, ca, client) == "first"
        clock.now += 1.0
        cn, second = await asyncio.to_thread(_served_cn, port, ca, client)
        assert cn == "second" and seen == [True]
        assert first.getpeercert() is not None and first.fileno() != -1  # the old one stays

        # half-written: a new certificate beside the old key; refused, counted, old one kept
        shutil.copyfile(pki["third"].cert, tmp_path / "live" / "tls.crt")
        clock.now += 1.0
        assert await asyncio.to_thread(_cn, port, ca, client) == "second"
        assert seen == [True, False]
        clock.now += 1.0  # unchanged since: not tried again, not counted again
        assert await asyncio.to_thread(_cn, port, ca, client) == "second"
        assert seen == [True, False]
        shutil.copyfile(pki["third"].key, tmp_path / "live" / "tls.key")  # the key arrives
        clock.now += 1.0
        assert await asyncio.to_thread(_cn, port, ca, client) == "third"
        assert seen == [True, False, True]
    finally:
        for sock in (first, second):
            if sock is not None:
                sock.close()
        await server.aclose()


def _grpc_server(renewing: RenewingTls) -> tuple[grpc.Server, int]:
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    port = server.add_secure_port(f"127.0.0.1:{free_port()}", renewing.grpc_credentials())
    server.start()
    return server, port


async def test_grpc_aio_credentials_take_the_renewal_at_the_next_handshake(
    pki: dict[str, CertPair], tmp_path: Path
) -> None:
    clock, seen = Clock(), []  # type: ignore[var-annotated]  # filled by the callback
    renewing = _renewing(pki, tmp_path / "live", clock, seen)
    server, port = _grpc_server(renewing)
    ca, client = pki["ca"], pki["client"]
    try:
        assert await asyncio.to_thread(_cn, port, ca, client) == "first"
        _install(pki["foreign"], tmp_path / "live")  # another CA's: still a whole pair
        clock.now += 1.0
        with pytest.raises(ssl.SSLError):  # the client checks the mesh CA: refused by it
            await asyncio.to_thread(_cn, port, ca, client)
        _install(pki["second"], tmp_path / "live")
        clock.now += 1.0
        assert await asyncio.to_thread(_cn, port, ca, client) == "second"
        assert seen == [True, True]
    finally:
        server.stop(None)
