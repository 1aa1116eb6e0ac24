"""Server-side TLS of the gRPC services (the filter server, the rate-limit service): one
``ssl.SSLContext`` for the built-in HTTP/2 transport and the matching grpc.aio credentials, both
mutual TLS (TLS 1.2 at least, ALPN ``h2``, a client certificate signed by the CA required), and
the start-up rule that a service beyond loopback speaks TLS unless the operator allows
plaintext. Plain files in, nothing from the policy model (runtime is below it)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.errors import PlaintextRefused
from runtime.h2.server import is_loopback

if TYPE_CHECKING:
    import grpc

__all__ = [
    "PlaintextRefused",
    "ServerTlsFiles",
    "check_plaintext",
    "grpc_credentials",
    "server_context",
]


@dataclass(frozen=True)
class ServerTlsFiles:
    cert: str
    key: str
    ca: str  # client certificates must be signed by it


def check_plaintext(what: str, host: str, tls: ServerTlsFiles | None, allowed: bool) -> None:
    if tls is None and not allowed and not is_loopback(host.strip("[]")):
        raise PlaintextRefused(
            f"{what} would listen on {host} without TLS: give {what}.tls (cert, key, ca, "
            f"client_cert, client_key) or set {what}.allow_plaintext: true"
        )


def server_context(files: ServerTlsFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert, files.key)
    ctx.load_verify_locations(files.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    return ctx


def grpc_credentials(files: ServerTlsFiles) -> grpc.ServerCredentials:
    """grpc.aio's server credentials for the same files (client certificate required)."""
    import grpc  # only the grpc.aio transport needs it

    return grpc.ssl_server_credentials(
        [(Path(files.key).read_bytes(), Path(files.cert).read_bytes())],
        root_certificates=Path(files.ca).read_bytes(),
        require_client_auth=True,
    )
