"""What the batch benchmarks share (batch_valleys.py, batch_autoscale.py): the example policy
on free loopback ports with its batch runner, the job's input lines, reading one sample of a
``/metrics`` page."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.ports import free_port  # noqa: E402

KEY = "tw-demo-pro-key"  # the bench's tenant: pro's token bucket is large, never the bottleneck
MODEL = "llama-3.1-8b"


def example_on_free_ports() -> tuple[dict[str, Any], dict[str, int]]:
    """``examples/mesh.yaml`` without its sidecar and ordinary service, every address on a free
    port (``ports``: name → port; ``em`` is left to the caller: the chat replicas' base)."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "mesh.yaml").read_text())
    doc.pop("sidecars")
    doc["services"].pop("inventory")
    gw = doc["gateways"]["edge"]
    gw["routes"] = [r for r in gw["routes"] if r.get("service") != "inventory"]
    ports: dict[str, int] = {}

    def port(name: str) -> int:
        return ports.setdefault(name, free_port())

    doc["control_plane"]["xds"] = f"127.0.0.1:{port('xds')}"
    doc["control_plane"]["metrics"] = f"127.0.0.1:{port('cp')}"
    doc["ratelimit"]["address"] = f"127.0.0.1:{port('rl')}"
    doc["ratelimit"]["metrics_port"] = port("rlm")
    doc["filters"]["address"] = f"127.0.0.1:{port('fs')}"
    doc["filters"]["metrics_port"] = port("fsm")
    doc["pools"]["chat-small"]["emulated"]["base_port"] = port("em2")
    doc["services"]["batch-api"]["endpoints"] = [f"127.0.0.1:{port('api')}"]
    gw["listen"] = f"127.0.0.1:{port('gw')}"
    doc["batch"]["runner"]["metrics_port"] = port("runner")
    return doc, ports


def lines(n: int, tokens: int) -> list[dict[str, Any]]:
    """``n`` batch input lines: chat completions of ``tokens`` tokens at most."""
    return [
        {
            "custom_id": f"l{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "max_tokens": tokens,
                "messages": [{"role": "user", "content": f"summarise {i}: " + "text " * 60}],
            },
        }
        for i in range(n)
    ]


async def gauge(http: aiohttp.ClientSession, url: str, name: str) -> float:
    """The value of the sample ``name`` (a regex: escape its braces) on the page at ``url``;
    0 when it is not there."""
    async with http.get(url) as r:
        text = await r.text()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def start_up(run: Path, text: str, *flags: str) -> subprocess.Popen[str]:
    """``tokenweir up`` (this interpreter's) on the policy ``text``, written to
    ``run/mesh.yaml``, its state under ``run/up``; returns once it says it is ready."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "mesh.yaml").write_text(text)
    tokenweir = Path(sys.executable).parent / "tokenweir"
    argv = [str(tokenweir), "--log-level", "warning", "up", *flags, "--no-prometheus", "--fresh",
            "-c", str(run / "mesh.yaml"), "--run-dir", str(run / "up")]  # fmt: skip
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert up.stdout is not None
    try:
        for line in up.stdout:
            if "tokenweir up: ready" in line:
                return up
            if "failed" in line:
                raise RuntimeError(line)
        raise RuntimeError("tokenweir up ended before it was ready")
    except BaseException:
        stop_up(up)
        raise


def stop_up(up: subprocess.Popen[str]) -> None:
    """Stop ``tokenweir up`` as Ctrl-C does (it stops its children), killing it after 60 s."""
    up.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        up.wait(60)
    if up.poll() is None:
        up.kill()
