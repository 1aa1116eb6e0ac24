"""`tokenweir up --replicas ...` with named backends, for the scale-out tests and drills: the
banner parsed into each replica's pid, port and admin URL; up's later output (restarts) kept."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.helpers import ChildProcess, free_port, free_port_block, wait_for_port
from tests.integration.up_process import ROOT, TOKENWEIR

__all__ = ["Load", "ReplicaMesh", "load", "replica_mesh"]

_NAME = re.compile(r"(?P<name>[a-z]\S*#\d+):?\s.*\bpid (?P<pid>\d+)")
_ADMIN = re.compile(r"admin (http://\S+)")


def policy_text(*, gw: int, xds: int, metrics: int, rl: int, fs: int, backends: list[int]) -> str:
    eps = ", ".join(f"127.0.0.1:{p}" for p in backends)
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{metrics}, debounce: 50ms}}
ratelimit: {{address: 127.0.0.1:{rl}, timeout: 2s, failure_mode_deny: true, redis_failure_mode: closed}}
filters: {{address: 127.0.0.1:{fs}, message_timeout: 5s}}
pools:
  chat:
    models: [m]
    endpoints: [{eps}]
    health_check: {{interval: 1s}}
    retries: {{enabled: false}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: chat
        match: {{prefix: /v1/}}
        pool: chat
        rate_limit: {{enabled: true}}
        filters: {{plugins: [identity, tokens, prefix, lane, usage]}}
tiers:
  small:
    lane: interactive
    max_tokens: 100
    quotas: {{tokens: {{burst: 3000, refill_per_second: 50}}}}
  big:
    lane: interactive
    max_tokens: 100
    quotas: {{tokens: {{burst: 100000000, refill_per_second: 1000000}}}}
tenants:
  tight: {{tier: small, api_keys: [tw-tight]}}
  roomy: {{tier: big, api_keys: [tw-roomy]}}
"""


@dataclass
class ReplicaMesh:
    proc: subprocess.Popen[str]
    gateway: int
    banner: str
    pids: dict[str, int]  # "edge#0", "filters#1", "ratelimit#0", "controlplane#1" → pid
    admins: dict[str, str]  # "edge#0" → admin URL
    cp_metrics: list[int]
    output: list[str] = field(default_factory=list)  # up's lines after the banner

    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway}/v1/chat/completions"

    def later(self) -> str:
        return "".join(self.output)

    def wait_output(self, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.later():
                for line in self.later().splitlines():  # a restarted replica's new pid, admin
                    if m := re.search(r"(\S+#\d+) rejoined \(pid (\d+)(?:, admin (\S+))?\)", line):
                        self.pids[m.group(1)] = int(m.group(2))
                        if m.group(3):
                            self.admins[m.group(1)] = m.group(3)
                return
            time.sleep(0.1)
        raise AssertionError(f"up never said {needle!r}; it said:\n{self.later()}")

    def admin(self, key: str, path: str) -> str:
        with urllib.request.urlopen(self.admins[key] + path, timeout=5) as r:
            return r.read().decode()

    def stat(self, key: str, name: str) -> int:
        for line in self.admin(key, f"/stats?filter=^{re.escape(name)}$").splitlines():
            k, _, v = line.partition(": ")
            if k == name and v.strip().isdigit():
                return int(v)
        return 0

    def cp_metric(self, i: int, needle: str) -> list[str]:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.cp_metrics[i]}/metrics", timeout=5
        ) as r:
            return [ln for ln in r.read().decode().splitlines() if ln.startswith(needle)]


@contextlib.contextmanager
def replica_mesh(tmp: Path, replicas: str, *, backends: int = 3) -> Iterator[ReplicaMesh]:
    """Named backends plus `tokenweir up --replicas REPLICAS`; stops everything."""
    ports = [free_port() for _ in range(backends)]
    kids = [
        ChildProcess(
            [sys.executable, "-m", "tests.integration.named_backend", "--port", str(p), "--name", f"b{i}"],
            log=tmp / f"backend-{i}.log",
        )
        for i, p in enumerate(ports)
    ]  # fmt: skip
    try:
        for p in ports:
            wait_for_port(p)
        gw, xds, metrics, rl, fs = (free_port_block(4) for _ in range(5))
        (tmp / "mesh.yaml").write_text(
            policy_text(gw=gw, xds=xds, metrics=metrics, rl=rl, fs=fs, backends=ports)
        )
        argv = [str(TOKENWEIR), "up", "-c", str(tmp / "mesh.yaml"), "--run-dir", str(tmp / "run"),
                "--state-dir", str(tmp / "state"), "--fresh", "--replicas", replicas,
                "--drain-timeout", "1"]  # fmt: skip
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
        )
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "tokenweir up: ready" in line:
                break
        banner = "".join(lines)
        pids, admins = {}, {}
        for line in lines:
            m = _NAME.search(line.replace("control plane#", "controlplane#"))
            if m:
                pids[m.group("name")] = int(m.group("pid"))
                if a := _ADMIN.search(line):
                    admins[m.group("name")] = a.group(1)
        count = (
            int(re.search(r"controlplane=(\d+)", replicas).group(1))
            if "controlplane" in replicas
            else 1
        )  # type: ignore[union-attr]
        mesh = ReplicaMesh(proc, gw, banner, pids, admins, [metrics + i for i in range(count)])
        reader = threading.Thread(target=_drain, args=(proc, mesh.output), daemon=True)
        reader.start()
        try:
            assert "tokenweir up: ready" in banner, banner
            yield mesh
        finally:
            proc.send_signal(2)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            reader.join(5)
            proc.stdout.close()
    finally:
        for k in kids:
            k.close()


def _drain(proc: subprocess.Popen[str], out: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)


@dataclass
class Load:
    ok: int = 0
    failed: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    timeline: list[tuple[float, bool]] = field(default_factory=list)  # (sent at, ok)

    def note(self, t: float, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        good = status == "200"
        self.ok += good
        self.failed += not good
        self.timeline.append((t, good))

    def ok_after(self, t: float) -> int:
        """Requests sent at ``t`` or later that succeeded."""
        return sum(1 for at, good in self.timeline if at >= t and good)

    def failed_after(self, t: float) -> int:
        """Requests sent at ``t`` or later that failed."""
        return sum(1 for at, good in self.timeline if at >= t and not good)


async def load(
    url: str,
    *,
    clients: int,
    seconds: float = 0.0,
    stop: asyncio.Event | None = None,
    key: str = "tw-roomy",
) -> Load:
    """``clients`` loops of chat requests for ``seconds`` (or until ``stop`` is set), a new
    connection per request (the kernel spreads connections over the gateways); every outcome
    counted."""
    out = Load()
    loop = asyncio.get_running_loop()
    start = loop.time()
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}

    async def client(i: int) -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=10.0, limits=limits) as http:
            n = 0
            while not stop.is_set() if stop is not None else loop.time() - start < seconds:
                n += 1
                headers = {"authorization": f"Bearer {key}", "x-session-id": f"c{i}-{n}"}
                sent = loop.time() - start
                try:
                    r = await http.post(url, json=body, headers=headers)
                    status = str(r.status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                out.note(sent, status)

    await asyncio.gather(*(client(i) for i in range(clients)))
    return out
