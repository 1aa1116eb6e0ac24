"""TLS of a gateway listener (``gateways.NAME.tls``) and of the upstream connections to a pool or
service on another host (``pools.NAME.tls`` / ``services.NAME.tls``). docs/policy.md "TLS".

Certificates reach Envoy by file-based SDS: for each certificate the control plane writes a small
SDS file into ``sds_dir`` naming the certificate and key files, and Envoy watches the directory
holding them (``watched_directory``): a certificate renewed by moving new files into place (what
cert-manager and Kubernetes secret volumes do) is picked up without dropping a connection.

:func:`tls_file_issues` reads the files a policy names (the loader calls it): a missing or
unreadable file, a key that does not belong to its certificate, a CA file without a
certificate, each an issue on the key's line; relative paths are resolved next to the policy.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

if TYPE_CHECKING:  # typeshed's name for "an instance of a dataclass" (no runtime object)
    from _typeshed import DataclassInstance

    class _WithTlsFiles(DataclassInstance, Protocol):
        """The parts of a :class:`policy.model.Policy` that name TLS files (that module imports
        this one, so the policy is described here, not imported)."""

        @property
        def gateways(self) -> Mapping[str, DataclassInstance]: ...
        @property
        def pools(self) -> Mapping[str, DataclassInstance]: ...
        @property
        def services(self) -> Mapping[str, DataclassInstance]: ...


__all__ = [
    "ClientCertificates",
    "GatewayTls",
    "Issues",
    "TlsCertificate",
    "UpstreamTls",
    "absolute",
    "check_ca",
    "check_pair",
    "read_pem",
    "tls_file_issues",
]


@dataclass(frozen=True)
class TlsCertificate:
    """One certificate chain and its key; ``sni``: the server names it answers (none: the
    default, served when the client names no other)."""

    cert: str
    key: str
    sni: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClientCertificates:
    """mTLS: clients present a certificate signed by ``ca``; with ``required: false`` a client
    without one still connects (and gets no certificate identity)."""

    ca: str
    required: bool = True


@dataclass(frozen=True)
class GatewayTls:
    certificates: tuple[TlsCertificate, ...]
    min_version: Literal["TLSv1_2", "TLSv1_3"] = "TLSv1_2"
    alpn: tuple[Literal["h2", "http/1.1"], ...] = ("h2", "http/1.1")
    client_certificates: ClientCertificates | None = None
    sds_dir: str = ".tokenweir/sds"  # where the SDS files go (next to the policy when relative)

    def __post_init__(self) -> None:
        if not self.certificates:
            raise ValueError("certificates: give at least one {cert, key}")
        seen: set[str] = set()
        for c in self.certificates:
            for name in c.sni:
                if name in seen:
                    raise ValueError(f"certificates: server name {name!r} is given twice")
                seen.add(name)
        if sum(1 for c in self.certificates if not c.sni) > 1:
            raise ValueError("certificates: at most one certificate without sni (the default)")


@dataclass(frozen=True)
class UpstreamTls:
    """Envoy speaks TLS to the endpoints: verified against ``ca`` (the system bundle when
    absent), with ``sni`` as the server name; ``cert``/``key``: a client certificate."""

    ca: str | None = None
    sni: str | None = None
    cert: str | None = None
    key: str | None = None
    alpn: tuple[Literal["h2", "http/1.1"], ...] = ()

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("give cert and key together (a client certificate), or neither")


_SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"

Issues = list[tuple[str, str]]  # (key path, message)

_D = TypeVar("_D", bound="DataclassInstance")


_P = TypeVar("_P", bound="_WithTlsFiles")


def tls_file_issues(policy: _P, base_dir: Path, read_gateways: bool = True) -> tuple[_P, Issues]:
    """``policy`` with every TLS file path made absolute, and the problems with those files
    (``read_gateways=False``: the gateways' paths made absolute, their files not read)."""
    issues: Issues = []
    gateways: dict[str, DataclassInstance] = {}
    for name, gw in policy.gateways.items():
        tls = getattr(gw, "tls", None)
        if tls is not None:
            at = f"gateways.{name}.tls"
            tls = _gateway(tls, at, base_dir, issues, read=read_gateways)
            gw = dataclasses.replace(gw, tls=tls)
        gateways[name] = gw
    pools = {n: _upstream(p, f"pools.{n}.tls", base_dir, issues) for n, p in policy.pools.items()}
    services = {
        n: _upstream(s, f"services.{n}.tls", base_dir, issues) for n, s in policy.services.items()
    }
    resolved = dataclasses.replace(policy, gateways=gateways, pools=pools, services=services)
    return resolved, issues


def _gateway(tls: GatewayTls, at: str, base: Path, issues: Issues, read: bool) -> GatewayTls:
    if not read:
        return _absolute(tls, base)
    certs = []
    for i, c in enumerate(tls.certificates):
        cert = read_pem(base, c.cert, f"{at}.certificates[{i}].cert", issues)
        key = read_pem(base, c.key, f"{at}.certificates[{i}].key", issues)
        if cert and key:
            check_pair(cert, key, f"{at}.certificates[{i}].key", issues)
        certs.append(dataclasses.replace(c, cert=cert or c.cert, key=key or c.key))
    client = tls.client_certificates
    if client is not None:
        ca = read_pem(base, client.ca, f"{at}.client_certificates.ca", issues)
        if ca:
            check_ca(ca, f"{at}.client_certificates.ca", issues)
        client = dataclasses.replace(client, ca=ca or client.ca)
    sds = absolute(base, tls.sds_dir)
    return dataclasses.replace(
        tls, certificates=tuple(certs), client_certificates=client, sds_dir=sds
    )


def _absolute(tls: GatewayTls, base: Path) -> GatewayTls:
    """The paths made absolute, no file read."""
    certs = tuple(
        dataclasses.replace(c, cert=absolute(base, c.cert), key=absolute(base, c.key))
        for c in tls.certificates
    )
    client = tls.client_certificates
    if client is not None:
        client = dataclasses.replace(client, ca=absolute(base, client.ca))
    sds = absolute(base, tls.sds_dir)
    return dataclasses.replace(tls, certificates=certs, client_certificates=client, sds_dir=sds)


def absolute(base: Path, name: str) -> str:
    """``name`` made absolute next to the policy, *without* following symbolic links: a
    Kubernetes Secret volume presents ``tls.crt`` as a link into a timestamped directory that a
    renewal replaces, so the path (and the directory Envoy watches) must stay the link's."""
    return os.path.abspath(os.path.join(base, name))


def _upstream(target: _D, at: str, base: Path, issues: Issues) -> _D:
    tls: UpstreamTls | None = getattr(target, "tls", None)
    if tls is None:
        return target
    ca = read_pem(base, tls.ca, f"{at}.ca", issues) if tls.ca else None
    if ca:
        check_ca(ca, f"{at}.ca", issues)
    cert = read_pem(base, tls.cert, f"{at}.cert", issues) if tls.cert else None
    key = read_pem(base, tls.key, f"{at}.key", issues) if tls.key else None
    if cert and key:
        check_pair(cert, key, f"{at}.key", issues)
    fixed = dataclasses.replace(
        tls, ca=ca or tls.ca or _SYSTEM_CA, cert=cert or tls.cert, key=key or tls.key
    )
    return dataclasses.replace(target, tls=fixed)


def read_pem(base: Path, name: str, at: str, issues: Issues) -> str | None:
    path = Path(absolute(base, name))
    try:
        with path.open("rb") as fh:
            head = fh.read(1 << 16)
    except OSError as exc:
        issues.append((at, f"cannot read {path}: {exc.strerror or exc}"))
        return None
    if b"-----BEGIN " not in head:
        issues.append((at, f"{path} is not a PEM file (no -----BEGIN line)"))
        return None
    return str(path)


def check_pair(cert: str, key: str, at: str, issues: Issues) -> None:
    """The key must belong to the certificate (what Envoy would refuse, found before it does)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        why = "does not match the certificate" if "mismatch" in str(exc).lower() else str(exc)
        issues.append((at, f"{key}: {why} ({cert})"))


def check_ca(ca: str, at: str, issues: Issues) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(ca)
    except ssl.SSLError as exc:
        issues.append((at, f"{ca}: not a CA bundle: {exc}"))
