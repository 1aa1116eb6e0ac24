"""Write the SDS files a policy's TLS gateways name (:func:`controlplane.translate.tls.sds_documents`).

The reloader writes them before it publishes a snapshot whose listeners name them. A file is
replaced only when its content changes, by a rename into the watched directory (Envoy reloads
on a move, never on a half-written file). On a gateway host other than the control plane's,
``tokenweir sds -c POLICY`` writes the same files (docs/deploy.md "TLS on Kubernetes").
"""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.translate.tls import sds_documents
from policy.model import Policy

__all__ = ["write_sds_files"]


def write_sds_files(policy: Policy) -> list[Path]:
    """Write (or leave, when unchanged) every SDS file; the paths written."""
    written = []
    for node, gw in policy.gateways.items():
        if gw.tls is None:
            continue
        for name, text in sds_documents(node, gw.tls).items():
            path = Path(name)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                if path.read_text(encoding="utf-8") == text:
                    continue
            except OSError:
                pass
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
            written.append(path)
    return written
