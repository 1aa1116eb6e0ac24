"""SIGTERM to `tokenweir up` drains (issue 9, item 11): a long SSE stream through real Envoy and
the filter server flows to its end; the control plane's grpc.health.v1 answers NOT_SERVING
during the drain; new connections are refused once Envoy has closed its listener; every
process exits with no traceback, Envoys before the services."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import free_port, free_port_block
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKENS = 700  # at time_scale 3 the emulator streams this for ~10 s: longer than Envoy's drain


def _policy(gw: int, base: int, xds: int) -> str:
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{free_port()}, drain_timeout: 60s}}
filters: {{address: 127.0.0.1:{free_port()}, drain_timeout: 60s}}
pools:
  chat:
    models: [llama-3.1-8b]
    emulated: {{replicas: 1, profile: llama-3.1-8b-h100, base_port: {base}, time_scale: 3}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - {{name: chat, pool: chat, match: {{prefix: /}}, filters: {{plugins: [lane, usage]}}}}
"""


class Stream(threading.Thread):
    """One streamed chat completion; records each SSE data line and when it came."""

    def __init__(self, gw: int) -> None:
        super().__init__(daemon=True)
        self.gw = gw
        self.lines: list[tuple[float, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        body = json.dumps(
            {
                "model": "llama-3.1-8b",
                "messages": [{"role": "user", "content": "tell me a long story"}],
                "max_tokens": TOKENS,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.gw}/v1/chat/completions",
            data=body,
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        self.lines.append((time.monotonic(), line))
        except BaseException as exc:  # reported by the test
            self.error = exc


def _health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        req = health_pb2.HealthCheckRequest()
        return int(health_pb2_grpc.HealthStub(ch).Check(req, timeout=5).status)


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_sigterm_to_up_lets_a_long_stream_finish_and_refuses_new_work(tmp_path: Path) -> None:
    gw, xds = free_port(), free_port()
    (tmp_path / "mesh.yaml").write_text(_policy(gw, free_port_block(1), xds))
    run_dir = tmp_path / "run"
    proc, banner = start_up(tmp_path / "mesh.yaml", run_dir)
    rest = ""
    try:
        assert "tokenweir up: ready" in banner, banner
        assert _health(xds) == health_pb2.HealthCheckResponse.SERVING
        stream = Stream(gw)
        stream.start()
        deadline = time.monotonic() + 30
        while len(stream.lines) < 5:
            assert stream.error is None and time.monotonic() < deadline, stream.error
            time.sleep(0.02)

        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        seen_not_serving = refused_at = None
        while stream.is_alive() and time.monotonic() < signalled + 90:
            if seen_not_serving is None:
                try:
                    if _health(xds) == health_pb2.HealthCheckResponse.NOT_SERVING:
                        seen_not_serving = time.monotonic()
                except grpc.RpcError:
                    pass
            if refused_at is None and not _connects(gw):
                refused_at = time.monotonic()
            time.sleep(0.1)
        stream.join(5)
        proc.wait(60)  # on its own: the drain is over once the stream is
    finally:
        if proc.poll() is None:
            rest += stop_up(proc)
        elif proc.stdout is not None and not proc.stdout.closed:
            rest += proc.stdout.read()
            proc.stdout.close()
    assert stream.error is None, stream.error
    data = [line for _, line in stream.lines]
    assert data[-1] == "data: [DONE]", data[-3:]
    usage = json.loads(data[-2][len("data: ") :])["usage"]
    assert usage["completion_tokens"] == TOKENS
    after = [t for t, _ in stream.lines if t > signalled]
    assert len(after) > 100, "the stream did not keep flowing after SIGTERM"
    assert seen_not_serving is not None, "the control plane never answered NOT_SERVING"
    assert refused_at is not None and refused_at < stream.lines[-1][0], (
        "new connections were still accepted when the stream ended"
    )
    assert proc.returncode == 0, banner + rest
    assert "tokenweir up: stopped" in rest, rest
    logs = {p.name: p.read_text(errors="replace") for p in run_dir.glob("*.log")}
    for name, text in {"up": banner + rest, **logs}.items():
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
    assert "SIGTERM: draining" in logs["filters.log"]
