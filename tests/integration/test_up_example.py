"""The README's first contact, for real: `tokenweir up` on examples/mesh.yaml (ports moved to
free ones), then the calls the README shows."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port, free_port_block

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKENWEIR = Path(sys.executable).parent / "tokenweir"


def _relocated_example() -> tuple[str, int]:
    text = (ROOT / "examples" / "mesh.yaml").read_text()
    base = free_port_block(3)
    text = re.sub(r"base_port: \d+", f"base_port: {base}", text)
    ports: dict[str, int] = {}

    def swap(m: re.Match[str]) -> str:
        old = m.group(1)
        ports.setdefault(old, free_port())
        return f"127.0.0.1:{ports[old]}"

    text = re.sub(r"127\.0\.0\.1:(\d+)", swap, text)
    return text, ports["10000"]


def _chat(gw: int, key: str, max_tokens: int) -> tuple[int, dict[str, str], dict]:
    body = {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": max_tokens,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{gw}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def test_example_mesh_first_contact(tmp_path: Path) -> None:
    text, gw = _relocated_example()
    (tmp_path / "mesh.yaml").write_text(text)
    proc = subprocess.Popen(
        [str(TOKENWEIR), "up", "-c", str(tmp_path / "mesh.yaml"), "--run-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    out: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if "tokenweir up: ready" in line:
                break
        assert "tokenweir up: ready" in "".join(out), "".join(out)
        for part in (
            "redis",
            "emulator",
            "ratelimit",
            "filters",
            "control plane",
            "envoy gateway",
            "envoy sidecar",
        ):
            assert part in "".join(out), part

        status, _, answer = _chat(gw, "tw-demo-pro-key", 16)
        assert status == 200 and answer["usage"]["completion_tokens"] == 16

        status, _, err = _chat(gw, "not-a-key-at-all", 16)
        assert status == 401 and "error" in err

        # The free tier: max_tokens is clamped to 256 and the budget runs out within a few calls.
        codes = []
        for _ in range(20):
            status, headers, body = _chat(gw, "tw-demo-free-key", 256)
            codes.append(status)
            if status == 429:
                assert int(headers.get("retry-after") or headers.get("Retry-After")) >= 1
                assert body["error"]["code"] or body["error"]["type"]
                break
            assert status == 200 and body["usage"]["completion_tokens"] <= 256
        assert codes[-1] == 429, codes
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            proc.stdout.close()
    assert proc.returncode == 0
