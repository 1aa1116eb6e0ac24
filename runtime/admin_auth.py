"""Who may read the operator surfaces: ``/metrics``, the dashboard and ``/api/v1/*`` of the
control plane, and the ``/metrics`` of the filter server and the rate-limit service.

On loopback (the default) anyone on the machine may. Bound anywhere else, a bearer token is
required; it comes from a file (``TOKENWEIR_ADMIN_TOKEN_FILE``, what a Kubernetes Secret
volume gives) or the environment (``TOKENWEIR_ADMIN_TOKEN``), never from the policy, which is
kept in git. A server bound beyond loopback without one refuses to start. With a token set,
every request but ``/healthz`` (probes) must carry it, as ``Authorization: Bearer TOKEN`` or as
the password of HTTP Basic (what a browser sends for the dashboard after its prompt); it is
compared in constant time (``hmac.compare_digest``), and anything else is answered ``401``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

__all__ = [
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "AdminAuthError",
    "admin_token",
    "check_exposure",
    "is_loopback",
    "token_middleware",
]

TOKEN_ENV = "TOKENWEIR_ADMIN_TOKEN"
TOKEN_FILE_ENV = "TOKENWEIR_ADMIN_TOKEN_FILE"
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def check_exposure(what: str, host: str, token: str | None) -> None:
    """Refuse to serve ``what`` on ``host`` beyond loopback without a token."""
    if token is None and not is_loopback(host):
        raise AdminAuthError(
            f"{what} would listen on {host}, beyond this machine, without authentication: set "
            f"{TOKEN_FILE_ENV} (a file holding a token) or {TOKEN_ENV}, or bind it to 127.0.0.1"
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


def token_middleware(token: str) -> Middleware:
    expected = token.encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in _OPEN_PATHS:
            return await handler(request)
        given = _presented(request.headers.get("Authorization", ""))
        if given is None or not hmac.compare_digest(given.encode(), expected):
            return web.json_response(
                {"error": {"message": "authentication required", "code": "unauthorized"}},
                status=401,
                headers={"WWW-Authenticate": 'Basic realm="tokenweir", charset="UTF-8"'},
            )
        return await handler(request)

    return check
