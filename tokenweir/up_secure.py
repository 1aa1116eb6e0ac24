"""The secrets ``tokenweir up`` keeps in its state directory, each a file of mode 0600:

- ``redis-password``: its private Redis runs with ACL user ``tokenweir`` and this password (the
  ``default`` user wants it too, so ``redis-cli ping`` without it answers ``NOAUTH``), bound to
  127.0.0.1; the password reaches the other processes in ``TOKENWEIR_REDIS_URL`` (their
  environment, never their command line, which ``ps`` shows) and ``mesh.json`` (0600).
- ``admin-token``: when a gateway serves HTTPS (``examples/production.yaml``) the mesh counts as
  a production one, and the dashboard, ``/api/v1/*`` and every ``/metrics`` want this token
  (``runtime.admin_auth``), unless ``TOKENWEIR_ADMIN_TOKEN(_FILE)`` already names one.
- ``tls/``: a private CA and the gateway certificates a policy names under the state directory
  that do not exist yet (``controlplane.tls_material``).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from controlplane.tls_material import CertPair, make_ca, make_cert
from runtime.admin_auth import TOKEN_ENV, TOKEN_FILE_ENV

__all__ = [
    "REDIS_URL_ENV",
    "REDIS_USER",
    "Secure",
    "admin_token_file",
    "ensure_gateway_certs",
    "redis_config",
    "secret_file",
]

REDIS_URL_ENV = "TOKENWEIR_REDIS_URL"
REDIS_USER = "tokenweir"


@dataclass(frozen=True)
class Secure:
    """What ``up`` made or found before starting: the CA clients trust, the admin token file."""

    ca_file: Path | None = None
    admin_token_file: Path | None = None


def secret_file(path: Path, *, nbytes: int = 32) -> str:
    """The secret in ``path``, made (mode 0600) when missing; kept across runs."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    value = secrets.token_urlsafe(nbytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(value + "\n")
    return value


def redis_config(directory: Path, password: str) -> Path:
    """A redis.conf (0600) with the ACL: ``tokenweir`` and ``default`` both want ``password``.

    ``default`` is not turned off: Redis 7.0 replays the append-only file's MULTI blocks as the
    default user, and with it off every transaction of the file is refused at load (NOPERM):
    the live edits kept in the state directory would be lost on the next start."""
    path = directory / "redis-acl.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"user default on >{password} ~* &* +@all\n")
        fh.write(f"user {REDIS_USER} on >{password} ~* &* +@all\n")
    return path


def admin_token_file(state_dir: Path, environ: Mapping[str, str]) -> Path | None:
    """Where the admin token lives: the operator's (environment) or a generated one."""
    if environ.get(TOKEN_FILE_ENV):
        return Path(environ[TOKEN_FILE_ENV])
    if environ.get(TOKEN_ENV):
        return None  # given inline; nothing to write
    path = state_dir / "admin-token"
    secret_file(path)
    return path


def ensure_gateway_certs(policy_path: Path, state_dir: Path) -> Path | None:
    """Make the gateway certificates the policy names inside ``state_dir`` that are missing,
    signed by a private CA kept there (``tls/tokenweir-ca.crt``); that CA's path, or None when
    the policy names no such file. Read before the policy is loaded (the loader wants the files
    to exist), so this reads the YAML leniently: a malformed policy is the loader's to report."""
    try:
        raw = yaml.safe_load(policy_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    state = state_dir.resolve()
    wanted: list[tuple[Path, Path, list[str]]] = []
    for gw in _mapping(_mapping(raw).get("gateways")).values():
        tls = _mapping(_mapping(gw).get("tls"))
        for item in _list(tls.get("certificates")):
            c = _mapping(item)
            cert_name, key_name = c.get("cert"), c.get("key")
            if not isinstance(cert_name, str) or not isinstance(key_name, str):
                continue
            cert = (policy_path.parent / cert_name).resolve()
            key = (policy_path.parent / key_name).resolve()
            if cert.is_relative_to(state) and key.is_relative_to(state):
                sni = [str(n) for n in _list(c.get("sni"))]
                wanted.append((cert, key, sni))
    if not wanted:
        return None
    tls_dir = state / "tls"
    ca_cert = tls_dir / "tokenweir-ca.crt"
    ca = CertPair(ca_cert, tls_dir / "tokenweir-ca.key") if ca_cert.exists() else make_ca(tls_dir)
    for cert, key, sni in wanted:
        if cert.exists() and key.exists():
            continue
        pair = make_cert(
            cert.parent, cert.stem, ca, dns=("localhost", *sni), ips=("127.0.0.1", "::1")
        )
        os.replace(pair.cert, cert)
        os.replace(pair.key, key)
    return ca_cert


def _mapping(value: object) -> Mapping[str, object]:
    """A YAML mapping, or an empty one for anything else (lenient: the loader reports it)."""
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[object]:
    """A YAML sequence, or an empty one for anything else (lenient: the loader reports it)."""
    return value if isinstance(value, list) else []
