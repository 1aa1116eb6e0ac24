"""Who may read the operator surfaces: ``/metrics``, the dashboard and ``/api/v1/*`` of the
control plane, and the ``/metrics`` of the filter server and the rate-limit service.

On loopback (the default) anyone on the machine may. Bound anywhere else, a bearer token is
required; it comes from a file (``TOKENWEIR_ADMIN_TOKEN_FILE``, what a Kubernetes Secret
volume gives) or the environment (``TOKENWEIR_ADMIN_TOKEN``), never from the policy, which is
kept in git. A server bound beyond loopback without one refuses to start. With a token set,
every request but ``/healthz`` (probes) must carry it, as ``Authorization: Bearer TOKEN`` or as
the password of HTTP Basic (what a browser sends for the dashboard after its prompt); it is
compared in constant time (``hmac.compare_digest``), and anything else is answered ``401``.

mTLS instead of (or beside) the token: with ``TOKENWEIR_ADMIN_TLS_CERT`` and
``TOKENWEIR_ADMIN_TLS_KEY`` the surface serves HTTPS only (TLS 1.2 at least); with
``TOKENWEIR_ADMIN_CLIENT_CA`` as well, a client presenting a certificate signed by that CA is
let in without the token (the certificate is verified in the handshake: one of another CA, or
expired, gets no connection), and a client without one still needs the token. Bound beyond
loopback, a surface needs the token or the client CA.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = [
    "CLIENT_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_KEY_ENV",
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "AdminAuthError",
    "AdminTls",
    "admin_tls",
    "admin_token",
    "check_exposure",
    "is_loopback",
    "token_middleware",
]

TOKEN_ENV = "TOKENWEIR_ADMIN_TOKEN"
TOKEN_FILE_ENV = "TOKENWEIR_ADMIN_TOKEN_FILE"
TLS_CERT_ENV = "TOKENWEIR_ADMIN_TLS_CERT"
TLS_KEY_ENV = "TOKENWEIR_ADMIN_TLS_KEY"
CLIENT_CA_ENV = "TOKENWEIR_ADMIN_CLIENT_CA"
_OPEN_PATHS = frozenset({"/healthz"})
_MIN_LENGTH = 16


class AdminAuthError(Exception):
    """The admin token cannot be read, is too short, or is missing for a non-loopback bind."""


def admin_token(environ: Mapping[str, str]) -> str | None:
    """The token from ``TOKENWEIR_ADMIN_TOKEN_FILE`` (first) or ``TOKENWEIR_ADMIN_TOKEN``."""
    path = environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise AdminAuthError(f"{TOKEN_FILE_ENV}: cannot read {path}: {exc}") from exc
        where = f"{TOKEN_FILE_ENV} ({path})"
    else:
        token = environ.get(TOKEN_ENV, "").strip()
        where = TOKEN_ENV
        if not token:
            return None
    if len(token) < _MIN_LENGTH:
        raise AdminAuthError(
            f"{where}: the token has {len(token)} characters; at least {_MIN_LENGTH}"
        )
    return token


@dataclass(frozen=True)
class AdminTls:
    """HTTPS on the operator surfaces; ``client_ca``: client certificates it signs are accepted
    instead of the token. ``server`` and ``client`` are the two ends' SSL contexts."""

    cert: str
    key: str
    client_ca: str | None = None

    def server(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            ctx.load_verify_locations(self.client_ca)
            ctx.verify_mode = ssl.CERT_OPTIONAL  # verified when given; the token otherwise
        return ctx

    def client(self) -> ssl.SSLContext:
        """What a reader inside the mesh (the pool-state reader) connects with: the server's
        certificate checked against the client CA (one mesh CA) and the system bundle."""
        ctx = ssl.create_default_context()
        if self.client_ca is not None:
            ctx.load_verify_locations(self.client_ca)
        return ctx


def admin_tls(environ: Mapping[str, str]) -> AdminTls | None:
    """HTTPS settings from the environment (none: plain HTTP); the files are loaded once here
    so that a missing file or a key of another certificate stops the start with its path."""
    cert, key, ca = (environ.get(n) or None for n in (TLS_CERT_ENV, TLS_KEY_ENV, CLIENT_CA_ENV))
    if cert is None and key is None:
        if ca is not None:
            raise AdminAuthError(
                f"{CLIENT_CA_ENV} needs HTTPS: set {TLS_CERT_ENV} and {TLS_KEY_ENV} too"
            )
        return None
    if cert is None or key is None:
        raise AdminAuthError(f"set {TLS_CERT_ENV} and {TLS_KEY_ENV} together")
    tls = AdminTls(cert, key, ca)
    try:
        tls.server()
    except (OSError, ssl.SSLError) as exc:
        raise AdminAuthError(
            f"{TLS_CERT_ENV}={cert}, {TLS_KEY_ENV}={key}, {CLIENT_CA_ENV}={ca}: {exc}"
        ) from exc
    return tls


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def check_exposure(what: str, host: str, token: str | None, tls: AdminTls | None = None) -> None:
    """Refuse to serve ``what`` on ``host`` beyond loopback without a token or a client CA."""
    mtls = tls is not None and tls.client_ca is not None
    if token is None and not mtls and not is_loopback(host):
        raise AdminAuthError(
            f"{what} would listen on {host}, beyond this machine, without authentication: set "
            f"{TOKEN_FILE_ENV} (a file holding a token) or {TOKEN_ENV}, or client certificates "
            f"({TLS_CERT_ENV}, {TLS_KEY_ENV}, {CLIENT_CA_ENV}), or bind it to 127.0.0.1"
        )


def _presented(header: str) -> str | None:
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _verified_client(request: web.Request) -> bool:
    """The connection carries a client certificate the handshake verified (CERT_OPTIONAL: a
    certificate that does not verify ends the handshake, so any one here did)."""
    transport = request.transport
    return bool(transport is not None and transport.get_extra_info("peercert"))


def token_middleware(token: str | None, *, client_certificates: bool = False) -> Middleware:
    """``token`` (None: no token accepted) and, with ``client_certificates``, a verified client
    certificate: either lets a request in."""
    expected = token.encode() if token is not None else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in _OPEN_PATHS:
            return await handler(request)
        if client_certificates and _verified_client(request):
            return await handler(request)
        given = _presented(request.headers.get("Authorization", ""))
        if given is None or expected is None or not hmac.compare_digest(given.encode(), expected):
            return web.json_response(
                {"error": {"message": "authentication required", "code": "unauthorized"}},
                status=401,
                headers={"WWW-Authenticate": 'Basic realm="tokenweir", charset="UTF-8"'},
            )
        return await handler(request)

    return check
