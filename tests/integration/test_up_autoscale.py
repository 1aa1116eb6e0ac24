"""`tokenweir up --autoscale` end to end (issue 42): real Envoy, real emulator replicas started
and stopped by the online planner's desired count.

One run walks the whole loop: at a low rate the pool holds ``min_replicas``; a ramp raises
``tokenweir_pool_desired_replicas`` and replicas start (after their load time), one of them on a
port something else holds, so it fails to start, is counted, and another slot is used; the count
never passes ``max_replicas``; when the load ends, replicas leave the endpoints file (and so EDS)
first, finish their streams, then stop: every stream gets its ``[DONE]``.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port, free_port_block
from tests.integration.up_process import start_up, stop_up

pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial,
    pytest.mark.timeout(480),
]  # ramps a pool to its max: 2 sheds (503) once in a parallel run

MAX = 3


def _policy(gw: int, base: int, xds: int, metrics: int) -> str:
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{metrics}, drain_timeout: 30s}}
pools:
  chat:
    models: [m]
    endpoints_file: chat.endpoints
    emulated: {{replicas: 1, profile: seed-2k, base_port: {base}, time_scale: 2}}
    autoscale:
      min_replicas: 1
      max_replicas: {MAX}
      headroom: 0.3
      tbt_budget: 21.4ms
      interval: 0.5s
      window: 4s
      forecast: 4s
      scale_up_cooldown: 1s
      scale_down_cooldown: 4s
      scale_down_window: 4s
      load_time: 2s
      drain_timeout: 60s
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - {{name: chat, pool: chat, match: {{prefix: /}}}}
"""


class Load:
    """Streamed chat completions at ``rate`` per second, each on its own thread."""

    def __init__(self, gw: int, tokens: int) -> None:
        self.gw, self.tokens = gw, tokens
        self.rate = 0.0
        self.done = 0
        self.cut: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pacer = threading.Thread(target=self._pace, daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._pacer.start()

    def _pace(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            rate = self.rate  # read once: the test thread sets it to 0 at the ramp's end
            if rate <= 0:
                time.sleep(0.05)
                nxt = time.monotonic()
                continue
            t = threading.Thread(target=self._one, daemon=True)
            t.start()
            self._threads.append(t)
            nxt += 1.0 / rate
            time.sleep(max(0.0, nxt - time.monotonic()))

    def _one(self) -> None:
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "hello there"}],
             "max_tokens": self.tokens, "stream": True}
        ).encode()  # fmt: skip
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.gw}/v1/chat/completions", data=body,
            headers={"content-type": "application/json"},
        )  # fmt: skip
        last = ""
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        last = line
        except Exception as exc:  # reported by the test
            last = f"{type(exc).__name__}: {exc}"
        with self._lock:
            if last == "data: [DONE]":
                self.done += 1
            else:
                self.cut.append(last)

    def finish(self, timeout: float) -> None:
        self._stop.set()
        if self._pacer.is_alive():
            self._pacer.join(5)
        for t in self._threads:
            t.join(max(0.1, timeout))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _desired(metrics: int) -> tuple[int, str] | None:
    text = _get(f"http://127.0.0.1:{metrics}/metrics")
    m = re.search(
        r'^tokenweir_pool_desired_replicas\{pool="chat",reason="(\w+)"\} (\S+)', text, re.M
    )
    return (int(float(m.group(2))), m.group(1)) if m else None


def _api(metrics: int) -> dict:
    return json.loads(_get(f"http://127.0.0.1:{metrics}/api/v1/autoscale"))["pools"]["chat"]


def _metric(metrics: int, pattern: str) -> float:
    text = _get(f"http://127.0.0.1:{metrics}/metrics")
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def _serving(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [
        ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_up_autoscale_ramps_up_and_down_without_cutting_a_stream(tmp_path: Path) -> None:
    gw, xds, metrics, base = free_port(), free_port(), free_port(), free_port_block(MAX)
    policy = tmp_path / "mesh.yaml"
    policy.write_text(_policy(gw, base, xds, metrics))
    blocker = socket.socket()  # slot 1's port is taken: the replica started there fails
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("127.0.0.1", base + 1))
    blocker.listen(1)
    proc, banner = start_up(policy, tmp_path / "run", 240.0, ("--autoscale",))  # a busy box
    load = Load(gw, tokens=60)
    seen: list[tuple[float, int, str]] = []
    rest = ""
    try:
        assert "tokenweir up: ready" in banner, banner
        assert _serving(tmp_path / "chat.endpoints") == [f"127.0.0.1:{base}"]
        load.start()

        def watch(seconds: float, until=None) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                d = _desired(metrics)
                if d is not None:
                    seen.append((time.monotonic(), *d))
                if until is not None and until():
                    return
                time.sleep(0.25)

        load.rate = 0.5  # fits one replica (the step from 0 may read as a ramp for a window)
        watch(14)
        assert max(n for _, n, _ in seen) <= 2, seen
        steady = [(n, why) for t, n, why in seen if t > seen[-1][0] - 3]
        assert all(n == 1 for n, _ in steady), seen[-12:]

        load.rate = 12.0  # needs more than one replica, more than the bound allows
        eps = tmp_path / "chat.endpoints"
        watch(
            120, until=lambda: _api(metrics)["serving"] >= 2 and _desired(metrics) == (MAX, "max")
        )
        assert max(n for _, n, _ in seen) == MAX, seen
        assert _desired(metrics) == (MAX, "max"), seen[-5:]
        assert len(_serving(eps)) == 2  # slot 1 is blocked: 0 and 2 serve
        assert f"127.0.0.1:{base + 1}" not in _serving(eps)
        failures = r'^tokenweir_autoscale_replica_failures_total\{pool="chat"\} (\S+)'
        assert _metric(metrics, failures) >= 1
        api = _api(metrics)
        assert api["desired"] == MAX and api["serving"] == 2 and api["max"] == MAX

        # long streams in flight when the load stops: the scale-down must let them finish
        load.tokens = 300
        watch(3)
        load.rate = 0.0
        watch(150, until=lambda: len(_serving(eps)) == 1 and not _listening(base + 2))
        assert _serving(eps) == [f"127.0.0.1:{base}"], _serving(eps)
        assert not _listening(base + 2), "the drained replica still runs"
        assert _desired(metrics) == (1, "min")
        load.finish(120)
        assert all(n <= MAX for _, n, _ in seen)
        assert load.cut == [], load.cut[:5]
        assert load.done > 30
        stopped = r'^tokenweir_autoscale_replica_changes_total\{change="stop",pool="chat"\} (\S+)'
        deadline = time.monotonic() + 20  # counted once its process is signalled
        while _metric(metrics, stopped) < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _metric(metrics, stopped) >= 1
        cut = r'^tokenweir_autoscale_replica_changes_total\{change="cut",pool="chat"\} (\S+)'
        assert _metric(metrics, cut) == 0
    finally:
        load.finish(1)
        rest = stop_up(proc) if proc.poll() is None else ""
        blocker.close()
    assert "Traceback" not in rest, rest[-3000:]
