"""A rate-limit service whose policy names it by a Kubernetes Service name (Envoy resolves it;
the pod listens with ``--listen 0.0.0.0:…``) serves /metrics beside its gRPC port: it bound the
metrics server to the Service name, which resolves to other pods (or nothing) and crashed."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port, redis_server, wait_for_port
from tests.ratelimit_service.support import start_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_metrics_listen_beside_the_grpc_port_not_on_the_service_name(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\nratelimit: {address: 'tokenweir-ratelimit.tokenweir.svc.invalid:18081'}\n"
    )
    port, metrics = free_port(), free_port()
    with redis_server() as rport:
        child = start_service(
            policy,
            f"redis://127.0.0.1:{rport}/0",
            port,
            tmp_path,
            extra=["--metrics-port", str(metrics)],
        )
        try:
            wait_for_port(metrics, timeout=20)
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=5) as r:
                assert r.status == 200
            assert child.alive(), child.output()
        finally:
            child.close()
