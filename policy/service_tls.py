"""TLS of the filter server and the rate-limit service (``filters.tls`` / ``ratelimit.tls``):
mutual TLS between Envoy and each service. docs/policy.md "TLS of the filter server and the
rate-limit service".

The service presents ``cert``/``key`` and asks every client for a certificate signed by ``ca``
(``CERT_REQUIRED``: a client without one is refused in the handshake); Envoy's ext_proc and
rate-limit clusters present ``client_cert``/``client_key`` and verify the service's certificate
against the same ``ca`` (and its DNS name ``sni`` when given). TLS 1.2 at least, ALPN ``h2``.

``allow_plaintext``: a service bound beyond loopback without ``tls`` refuses to start unless
this is ``true`` (a network the operator vouches for, e.g. a pod's loopback behind a
NetworkPolicy is not needed for that: loopback is always allowed).

:func:`service_tls_issues` checks the files (reusing :mod:`policy.tls`'s checks): each problem
on its key's line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from policy.tls import Issues, UpstreamTls, check_ca, check_pair, read_pem

if TYPE_CHECKING:  # typeshed's name for "an instance of a dataclass" (no runtime object)
    from _typeshed import DataclassInstance

__all__ = ["ServiceTls", "service_tls_issues"]

_D = TypeVar("_D", bound="DataclassInstance")


@dataclass(frozen=True)
class ServiceTls:
    cert: str  # the service's certificate chain (PEM)
    key: str  # and its key
    ca: str  # verifies Envoy's client certificate, and Envoy verifies the service's with it
    client_cert: str  # Envoy's client certificate (the ext_proc / rate-limit cluster's)
    client_key: str
    sni: str | None = None  # the server name Envoy asks for and checks (a DNS SAN)

    def upstream(self) -> UpstreamTls:
        """What Envoy's cluster to this service speaks (controlplane.translate.tls)."""
        return UpstreamTls(
            ca=self.ca, sni=self.sni, cert=self.client_cert, key=self.client_key, alpn=("h2",)
        )


def service_tls_issues(policy: _D, base: Path) -> tuple[_D, Issues]:
    """``policy`` with the services' TLS paths made absolute, and the problems with them.
    ``policy``: a :class:`policy.model.Policy` (whose module imports this one through
    ``policy.servers``); its ``filters`` and ``ratelimit`` sections are read by name."""
    issues: Issues = []
    changes = {}
    for section in ("filters", "ratelimit"):
        server = getattr(policy, section)
        tls: ServiceTls | None = getattr(server, "tls", None) if server is not None else None
        if tls is None:
            continue
        at = f"{section}.tls"
        paths = {k: read_pem(base, getattr(tls, k), f"{at}.{k}", issues) for k in _FILES}
        if paths["cert"] and paths["key"]:
            check_pair(paths["cert"], paths["key"], f"{at}.key", issues)
        if paths["client_cert"] and paths["client_key"]:
            check_pair(paths["client_cert"], paths["client_key"], f"{at}.client_key", issues)
        if paths["ca"]:
            check_ca(paths["ca"], f"{at}.ca", issues)
        fixed = dataclasses.replace(tls, **{k: v for k, v in paths.items() if v})
        changes[section] = dataclasses.replace(server, tls=fixed)
    return (dataclasses.replace(policy, **changes) if changes else policy), issues


_FILES = ("cert", "key", "ca", "client_cert", "client_key")
