"""Server-side TLS of the gRPC services (the filter server, the rate-limit service): one
``ssl.SSLContext`` for the built-in HTTP/2 transport and the matching grpc.aio credentials
(:meth:`RenewingTls.grpc_credentials`), both
mutual TLS (TLS 1.2 at least, ALPN ``h2``, a client certificate signed by the CA required), and
the start-up rule that a service beyond loopback speaks TLS unless the operator allows
plaintext; and renewal: :class:`RenewingTls` re-reads the files when they change (cert-manager,
a Vault agent or a hand rotation rewrite them in place) before the next handshake, so a renewed
certificate is served without a restart and open connections stay. Plain files in, nothing
from the policy model (runtime is below it)."""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.errors import PlaintextRefused
from runtime.h2.server import is_loopback

if TYPE_CHECKING:
    import grpc

__all__ = [
    "PlaintextRefused",
    "RenewingTls",
    "ServerTlsFiles",
    "check_plaintext",
    "server_context",
]


@dataclass(frozen=True)
class ServerTlsFiles:
    cert: str
    key: str
    ca: str  # client certificates must be signed by it

    def paths(self) -> tuple[str, str, str]:
        return (self.cert, self.key, self.ca)


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


_log = logging.getLogger(__name__)
_Stamp = tuple[tuple[int, int, int], ...] | None


def _stamp(paths: tuple[str, ...]) -> _Stamp:
    """What says a file was rewritten: its inode (a renamed-in file, what cert-manager's
    atomic writer and ``mv`` do), size and mtime; None while one cannot be read."""
    try:
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in (os.stat(p) for p in paths))
    except OSError:
        return None


class RenewingTls:
    """A server's TLS files, read again when they change: :meth:`refresh` (called before each
    new connection's handshake, at most one look at the files per ``min_interval``) loads a
    renewed certificate, key and CA into the same :attr:`context`, which new handshakes then
    use; open connections keep theirs. A renewal is checked whole in a context of its own
    first: a half-written one (a new certificate beside the old key) or a bad file is refused,
    logged with the paths and counted (``on_reload(False)``), the certificate served so far
    stays, and it is tried again when the files change again. A CA is added, not swapped: a CA
    taken out of the file still verifies clients until a restart."""

    def __init__(
        self,
        files: ServerTlsFiles,
        *,
        on_reload: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_interval: float = 1.0,
    ) -> None:
        self.files = files
        self.on_reload = on_reload
        self.clock = clock
        self.min_interval = min_interval
        self._seen = _stamp(files.paths())
        self.context = server_context(files)  # bad files at the start stop it, with the error
        self._looked = clock()

    def refresh(self) -> bool:
        """Whether a renewal was loaded now."""
        now = self.clock()
        if now - self._looked < self.min_interval:
            return False
        self._looked = now
        stamp = _stamp(self.files.paths())
        if stamp is None or stamp == self._seen:
            return False  # unchanged, or a file missing for a moment mid-rotation
        self._seen = stamp
        try:
            server_context(self.files)  # the new files, whole, before the live context
            self.context.load_cert_chain(self.files.cert, self.files.key)
            self.context.load_verify_locations(self.files.ca)
        except (OSError, ssl.SSLError) as exc:
            _log.error(
                "TLS files changed but cannot be used (cert %s, key %s, ca %s): %s; still "
                "serving the certificate loaded before",
                self.files.cert, self.files.key, self.files.ca, exc,
            )  # fmt: skip
            self._report(ok=False)
            return False
        _log.info("TLS certificate renewed from %s", self.files.cert)
        self._report(ok=True)
        return True

    def _report(self, *, ok: bool) -> None:
        if self.on_reload is not None:
            self.on_reload(ok)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """grpc.aio's credentials for the same files, renewed the same way: gRPC asks before
        each handshake (``dynamic_ssl_server_credentials``)."""
        import grpc  # only the grpc.aio transport needs it

        def config(files: ServerTlsFiles) -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration(
                [(Path(files.key).read_bytes(), Path(files.cert).read_bytes())],
                root_certificates=Path(files.ca).read_bytes(),
            )

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            if not self.refresh():  # checks the files whole; counts and logs
                return None
            try:
                return config(self.files)
            except OSError:  # rewritten again since: the next handshake looks again
                return None

        return grpc.dynamic_ssl_server_credentials(
            config(self.files),
            fetch,  # type: ignore[arg-type]  # grpc's stub omits the None its docs allow
            require_client_authentication=True,
        )
