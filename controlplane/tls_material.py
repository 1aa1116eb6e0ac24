"""A private CA and the certificates signed by it, made with the ``openssl`` command.

``tokenweir up`` makes them into its state directory when a policy's gateway asks for TLS
without naming files (``examples/production.yaml``); the tests make theirs the same way. Keys
are written mode 0600. Not a PKI: for production, name the files your CA issued.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CertPair", "TlsMaterialError", "make_ca", "make_cert"]


class TlsMaterialError(Exception):
    """openssl is missing or refused (its message included)."""


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise TlsMaterialError("the openssl command is needed to make certificates; install it")
    out = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise TlsMaterialError(f"openssl {args[0]} failed: {out.stderr.strip()[-500:]}")


def _key(path: Path) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )
    os.chmod(path, 0o600)


def make_ca(directory: Path, name: str = "tokenweir-ca", days: int = 825) -> CertPair:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    _key(pair.key)
    _openssl(
        "req", "-x509", "-new", "-key", str(pair.key), "-out", str(pair.cert), "-days", str(days),
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return pair


def make_cert(
    directory: Path,
    name: str,
    ca: CertPair,
    *,
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    uris: tuple[str, ...] = (),
    client: bool = False,
    days: int = 90,
    expired: bool = False,
) -> CertPair:
    """A leaf certificate ``CN=name`` with the given SANs, signed by ``ca``; ``expired``: valid
    for no time at all, expired a second later (for tests of refusal)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    _key(pair.key)
    csr = directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips] + [f"URI:{u}" for u in uris]
    lines = [
        "basicConstraints=CA:FALSE",
        f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl("req", "-new", "-key", str(pair.key), "-out", str(csr), "-subj", f"/CN={name}")
    validity = ["-days", "0" if expired else str(days)]  # 0: notAfter == notBefore == now
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(pair.cert), "-extfile", str(ext), *validity,
    )  # fmt: skip
    csr.unlink(missing_ok=True)
    ext.unlink(missing_ok=True)
    return pair
