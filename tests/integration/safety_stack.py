"""A governed stack for the safe-retry tests: SGLang emulators as processes, the control plane
and Envoy (mesh harness), the rate-limit service as a process, the filter server in-process (its
metrics are read directly), Redis; and helpers to read the emulators' request counters."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from filters.app import FilterApp, Settings
from policy import load_policy
from quota.reader import QuotaReader
from tests.helpers import ChildProcess, free_port, free_port_block, wait_for_port
from tests.integration.mesh_harness import Mesh, mesh, service_processes

__all__ = ["BUDGET", "KEYS", "SafetyStack", "backend_requests", "safety_stack"]

BUDGET = 1_000_000
KEYS = {"acme": "acme-key-1234", "globex": "globex-key-1234"}
_FINISHED = re.compile(r"^sglang:num_requests_total\{[^}]*\}\s+([0-9.e+]+)$", re.M)


async def backend_requests(session: aiohttp.ClientSession, port: int) -> int:
    """Requests the emulator on ``port`` has finished (its ``sglang:num_requests_total``)."""
    async with session.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    return int(sum(float(v) for v in _FINISHED.findall(text)))


def policy_text(
    gw: int,
    fp: int,
    rp: int,
    redis_url: str,
    replicas: list[int],
    extra: str,
    plugins: str,
    canary: str = "",
    metrics_port: int | None = None,
    shadow: list[int] | None = None,
    retries: bool = False,
    shadow_opts: str = "",
) -> str:
    eps = ", ".join(f"127.0.0.1:{p}" for p in replicas)
    metrics = f", metrics_port: {metrics_port}" if metrics_port else ""
    shadow_pool = shadow_route = ""
    if shadow:
        seps = ", ".join(f"127.0.0.1:{p}" for p in shadow)
        shadow_pool = (f"  shadow: {{models: [m1], endpoints: [{seps}], "
                       "health_check: {enabled: false}, retries: {enabled: false}}")  # fmt: skip
        shadow_route = f"        shadow: {{pool: shadow, fraction: 1.0{shadow_opts}}}"
    tenants = "\n".join(f"  {t}: {{tier: mid, api_keys: [{k}]}}" for t, k in KEYS.items())
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
ratelimit: {{address: 127.0.0.1:{rp}, timeout: 500ms, redis_url: "{redis_url}"}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 2s{metrics}}}
pools:
  chat:
    models: [m1]
    endpoints: [{eps}]
    health_check: {{enabled: false}}
{"" if retries else "    retries: {enabled: false}"}
{canary}
{shadow_pool}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: llm
        match: {{prefix: /v1/}}
        pool: chat
        rate_limit: {{enabled: true}}
        filters: {{plugins: [{plugins}]}}
{shadow_route}
tiers:
  mid:
    max_tokens: 64
    quotas: {{tokens: {{burst: {BUDGET}, refill_per_second: 0.001}}}}
tenants:
{tenants}
{extra}
"""


@dataclass
class SafetyStack:
    url: str
    mesh: Mesh
    app: FilterApp
    reader: QuotaReader
    replicas: list[int]
    session: aiohttp.ClientSession
    emulators: dict[int, ChildProcess]  # port → the emulator's process (for drills)

    async def backend_requests(self) -> int:
        return sum([await backend_requests(self.session, p) for p in self.replicas])

    async def spent(self, tenant: str) -> int:
        left = await self.reader.remaining(tenant, "m1", "interactive")
        assert left is not None
        return BUDGET - left

    async def settled(self, tenant: str, before: int, timeout: float = 5.0) -> int:
        """What ``tenant`` has spent once it moved from ``before`` and then stayed for 0.5 s
        (the settlement is fire-and-forget after the stream)."""
        end = time.monotonic() + timeout
        got = await self.spent(tenant)
        while got == before and time.monotonic() < end:
            await asyncio.sleep(0.05)
            got = await self.spent(tenant)
        await asyncio.sleep(0.5)
        return await self.spent(tenant)

    def metric(self, name: str, **labels: str) -> float:
        return self.app.metrics.registry.get_sample_value(name, labels) or 0.0

    def headers(self, tenant: str = "acme", **extra: str) -> dict[str, str]:
        return {"authorization": f"Bearer {KEYS[tenant]}", "content-type": "application/json",
                **extra}  # fmt: skip


async def _filter_servers(
    tmp_path: Path, redis_url: str, fp: int, count: int, children: list[ChildProcess]
) -> FilterApp:
    """The first filter server in this process (returned), the others as child processes."""
    policy = tmp_path / "mesh.yaml"
    app = FilterApp(Settings(policy_path=policy, redis_url=redis_url), clock=time.monotonic)
    await app.start()
    for i in range(1, count):
        argv = [sys.executable, "-m", "filters", "--policy", str(policy), "--redis-url",
                redis_url, "--listen", f"127.0.0.1:{fp + i}", "--log-level", "WARNING"]  # fmt: skip
        children.append(ChildProcess(argv, log=tmp_path / f"filters{i}.log"))
        await asyncio.to_thread(wait_for_port, fp + i, 30.0)
    return app


@contextlib.asynccontextmanager
async def safety_stack(
    tmp_path: Path,
    redis_port: int,
    *,
    replicas: int = 1,
    extra: str = "",
    slow: float = 1.0,
    plugins: str = "identity, idempotency, tokens, lane, usage",
    canary: str = "",
    canary_replicas: int = 0,
    shadow_replicas: int = 0,
    shadow_slow: float = 1.0,
    shadow_opts: str = "",
    retries: bool = False,
    filter_replicas: int = 1,
) -> AsyncIterator[SafetyStack]:
    """``canary``: the pool's canary section without its endpoints (``weight: 30, ...``); its
    ``canary_replicas`` emulators are the last ports of ``SafetyStack.replicas``.
    ``filter_replicas``: filter servers on consecutive ports (``replicas.filters``); the first
    runs in this process (its metrics are read directly), the others are child processes."""
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(redis_url)
    await r.flushdb()
    gw, rp = free_port(), free_port()
    fp = free_port_block(filter_replicas)
    if filter_replicas > 1:
        extra += f"\nreplicas: {{filters: {filter_replicas}}}\n"
    ports = [free_port() for _ in range(replicas + canary_replicas + shadow_replicas)]
    children = [
        ChildProcess(
            [sys.executable, "-m", "backends.emulator", "--port", str(p), "--model", "m1",
             "--time-scale", "0.05", "--seed", "7",
             "--slow", str(shadow_slow if i >= replicas + canary_replicas else slow),
             "--log-level", "WARNING"],
            log=tmp_path / f"emulator{i}.log",
        )
        for i, p in enumerate(ports)
    ]  # fmt: skip
    app: FilterApp | None = None
    session = aiohttp.ClientSession()
    try:
        for p in ports:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        base, extra_ports = ports[:replicas], ports[replicas : replicas + canary_replicas]
        shadow_ports = ports[replicas + canary_replicas :]
        canary_yaml, mport = "", None
        if canary_replicas:
            ceps = ", ".join(f"127.0.0.1:{p}" for p in extra_ports)
            canary_yaml = f"    canary: {{endpoints: [{ceps}], {canary}}}"
            mport = free_port()
        text = policy_text(
            gw,
            fp,
            rp,
            redis_url,
            base,
            extra,
            plugins,
            canary_yaml,
            mport,
            shadow_ports,
            retries,
            shadow_opts,
        )
        early = filter_replicas > 1  # every filter server up before Envoy's first health check
        if early:
            (tmp_path / "mesh.yaml").write_text(text)  # the file mesh() writes, written first
            app = await _filter_servers(tmp_path, redis_url, fp, filter_replicas, children)
        async with (
            mesh(tmp_path, text, {"edge": gw}) as m,
            service_processes(
                tmp_path, m.policy_path, None, {"ratelimit_service": rp}, timeout=30.0
            ),
        ):
            if not early:
                app = await _filter_servers(tmp_path, redis_url, fp, 1, children)
            if filter_replicas > 1:  # Envoy's health checks must have found every one
                want = [f"tokenweir_filters::127.0.0.1:{fp + i}::health_flags::healthy"
                        for i in range(filter_replicas)]  # fmt: skip
                end = time.monotonic() + 30.0
                while not all(w in text for text in [await m.clusters_text("edge")] for w in want):
                    assert time.monotonic() < end, "a filter server never became healthy"
                    await asyncio.sleep(0.1)
            assert app is not None
            reader = QuotaReader(r, load_policy(m.policy_path), timeout=5.0)
            emulators = dict(zip(ports, children, strict=False))
            yield SafetyStack(f"http://127.0.0.1:{gw}", m, app, reader, ports, session, emulators)
    finally:
        await session.close()
        if app is not None:
            await app.aclose()
        for c in children:
            c.close()
        await r.aclose()
