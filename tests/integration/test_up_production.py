"""``tokenweir up -c examples/production.yaml`` (its ports moved to free ones): HTTPS with the
generated CA answers 200, plain HTTP to that port 400 ``tls_required``, the dashboard and every
``/metrics`` 401 without the admin token and 200 with it, Redis ``NOAUTH`` without the password,
and each secret file mode 0600."""

from __future__ import annotations

import json
import re
import ssl
import stat
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port, free_port_block
from tests.integration.up_process import ROOT, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def _status(url: str, headers: dict[str, str] | None = None, **kw: object) -> int:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30, **kw) as r:  # type: ignore[arg-type]
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_production_example_locally(tmp_path: Path) -> None:
    text = (ROOT / "examples" / "production.yaml").read_text()
    ports = {
        p: free_port() for p in ("18210", "18201", "18281", "18291", "18285", "18296", "10443")
    }
    ports["30201"] = free_port_block(2)
    text = re.sub(r"\b(18210|18201|18281|18291|18285|18296|10443|30201)\b",
                  lambda m: str(ports[m.group(1)]), text)  # fmt: skip
    text = text.replace("replicas: 2, profile", "replicas: 2, time_scale: 0.05, profile")
    policy = tmp_path / "production.yaml"
    policy.write_text(text)
    proc, banner = start_up(policy, tmp_path / "run", timeout=300)
    try:
        assert "tokenweir up: ready" in banner, banner
        state = tmp_path / ".tokenweir" / "state"
        gw = ports["10443"]
        assert f"gateway: https://127.0.0.1:{gw}/v1/chat/completions" in banner
        ca = state / "tls" / "tokenweir-ca.crt"
        assert f"CA file: {ca}" in banner and f"admin token: {state / 'admin-token'}" in banner
        for secret in ("admin-token", "redis-password", "tls/gateway.key", "mesh.json"):
            assert stat.S_IMODE((state / secret).stat().st_mode) == 0o600, secret
        body = json.dumps(
            {
                "model": "llama-3.1-8b",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            }
        ).encode()
        req = urllib.request.Request(
            f"https://127.0.0.1:{gw}/v1/chat/completions", data=body,
            headers={"content-type": "application/json", "authorization": "Bearer tw-demo-pro-key"},
        )  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(ca))
        with urllib.request.urlopen(req, timeout=60, context=ctx) as r:
            assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] == 4
        assert _status(f"http://127.0.0.1:{gw}/v1/chat/completions") == 400
        token = (state / "admin-token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        for port, path in (
            (ports["18201"], "/dashboard/"), (ports["18201"], "/api/v1/pools"),
            (ports["18201"], "/metrics"), (ports["18291"], "/metrics"), (ports["18296"], "/metrics"),
        ):  # fmt: skip
            url = f"http://127.0.0.1:{port}{path}"
            assert (_status(url), _status(url, auth)) == (401, 200), url
        redis_port = re.search(r"redis://tokenweir@127\.0\.0\.1:(\d+)/0", banner)
        assert redis_port is not None, banner
        ping = subprocess.run(
            ["redis-cli", "-p", redis_port.group(1), "ping"], capture_output=True, text=True
        )
        assert "NOAUTH" in ping.stdout + ping.stderr
        assert (state / "redis-password").read_text().strip() not in banner
    finally:
        rest = stop_up(proc)
    assert proc.returncode == 0, banner + rest
