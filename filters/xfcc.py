"""``x-forwarded-client-cert`` as Envoy sets it from a verified client certificate (mTLS).

Envoy's gateway listener replaces any client-sent header (``SANITIZE_SET``, or ``SANITIZE``
without mTLS: controlplane.translate.tls), so what arrives here names the certificate the TLS
handshake verified: ``Hash=…;Subject="CN=acme,O=Example";URI=spiffe://…;DNS=a.example``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

__all__ = ["XFCC_HEADER", "certificate_identity", "parse_xfcc"]

XFCC_HEADER = "x-forwarded-client-cert"
Source = Literal["cn", "uri", "dns"]


def _split(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside double quotes."""
    parts: list[str] = []
    cur: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == sep and not quoted:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def parse_xfcc(value: str) -> list[tuple[str, str]]:
    """The ``(key, value)`` pairs of the first (the connecting client's) element."""
    first = _split(value, ",")[0]
    pairs = []
    for item in _split(first, ";"):
        key, sep, val = item.strip().partition("=")
        if sep:
            pairs.append((key.strip().lower(), val.strip().strip('"')))
    return pairs


def _cn(subject: str) -> str | None:
    for rdn in _split(subject, ","):
        k, _, v = rdn.strip().partition("=")
        if k.strip().upper() == "CN" and v.strip():
            return v.strip()
    return None


def certificate_identity(headers: Mapping[str, str], source: Source) -> str | None:
    """The tenant the verified client certificate names (its subject's CN, its first URI or DNS
    SAN), or None when no certificate was presented."""
    value = headers.get(XFCC_HEADER)
    if not value:
        return None
    pairs = parse_xfcc(value)
    if source == "cn":
        return next((_cn(v) for k, v in pairs if k == "subject"), None)
    want = "uri" if source == "uri" else "dns"
    return next((v for k, v in pairs if k == want and v), None)
