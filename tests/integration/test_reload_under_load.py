"""Reloads fail nothing: a 10,000-tenant, 100-route policy is reloaded while a steady loop of
requests runs through real Envoy, the filter server, the rate-limit service and the SGLang
emulator (all started by ``tokenweir up``): no request fails, none passes unrated."""

from __future__ import annotations

import asyncio
import random
import re
import time
from pathlib import Path

import aiohttp
import pytest

from tests.bigpolicy import big_policy_text
from tests.helpers import free_port
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
TENANTS, ROUTES, KEYS = 10_000, 100, 100  # requests use the first KEYS tenants' keys


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _unrated(stats: str) -> dict[str, int]:
    """Envoy's count of rate-limit calls that failed (the request then passed unrated)."""
    found = re.findall(r"^(\S*ratelimit\.(?:error|failure_mode_allowed)): (\d+)$", stats, re.M)
    return {k: int(v) for k, v in found if int(v)}


async def _get(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as r:
        return await r.text()


class _Load:
    """``workers`` clients in a loop; every answer's status is kept."""

    def __init__(self, url: str, workers: int) -> None:
        self.url, self.workers = url, workers
        self.statuses: dict[int, int] = {}
        self.errors: list[str] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*(self._client(s, random.Random(i)) for i in range(self.workers)))

    async def _client(self, s: aiohttp.ClientSession, rng: random.Random) -> None:
        while not self.stop.is_set():
            key = f"tw-key-{rng.randrange(KEYS):07d}"
            headers = {"authorization": f"Bearer {key}"}
            if rng.random() < 0.5:  # one of the header-matched routes, else the catch-all
                headers["x-route"] = f"r{rng.randrange(ROUTES - 1)}"
            body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2}  # fmt: skip
            try:
                async with s.post(
                    self.url + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    await r.read()
                    self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
                    if r.status != 200 and len(self.errors) < 10:
                        self.errors.append(
                            f"{time.strftime('%H:%M:%S')} {r.status} {await r.text()}"
                        )
            except aiohttp.ClientError as exc:
                if len(self.errors) < 10:
                    self.errors.append(f"{time.strftime('%H:%M:%S')} {exc!r}")
                self.statuses[-1] = self.statuses.get(-1, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


async def test_a_10k_tenant_reload_under_load_fails_nothing(tmp_path: Path) -> None:
    names = ("xds", "cp_metrics", "listen", "ratelimit", "rl_metrics", "filters", "filters_metrics")
    ports = {n: free_port() for n in names}
    backend = ("127.0.0.1", free_port())
    path = tmp_path / "mesh.yaml"

    def write(tenants: int, generation: int) -> None:
        # Timeouts with room for a shared 2-core test box; a loop blocked while a 10k-tenant
        # policy is built (seconds) still fails requests through them.
        text = big_policy_text(
            tenants=tenants, routes=ROUTES, ports=ports, backend=backend, emulated=True,
            generation=generation, rl_timeout="2s", message_timeout="2s",
        )  # fmt: skip
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)

    write(KEYS, 0)  # start small (start-up is not what is measured), then reload to 10k
    proc, banner = await asyncio.to_thread(start_up, path, tmp_path / "run", 240.0)
    try:
        assert "ready" in banner, banner
        admin = re.search(r"admin (http://\S+)", banner)
        assert admin, banner
        urls = [f"http://127.0.0.1:{ports[p]}/metrics" for p in ("rl_metrics", "filters_metrics")]
        load = _Load(f"http://127.0.0.1:{ports['listen']}", workers=6)
        runner = asyncio.create_task(load.run())
        ok = 'tokenweir_config_reloads_total{result="ok"}'
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(3.0)
            warm = load.total
            assert warm > 20, (load.statuses, load.errors)
            assert load.statuses.get(200) == warm, ("before any reload", load.statuses, load.errors)
            before = _unrated(await _get(s, f"{admin.group(1)}/stats"))
            marks = [f"{time.strftime('%H:%M:%S')} first write"]
            for generation in (1, 2):  # 100 -> 10k tenants, then 10k with every quota changed
                write(TENANTS, generation)
                deadline = time.monotonic() + 150
                while not all([_metric(await _get(s, u), ok) >= generation for u in urls]):
                    assert time.monotonic() < deadline, "the new policy was not applied"
                    await asyncio.sleep(0.2)
                marks.append(f"{time.strftime('%H:%M:%S')} generation {generation} applied")
            await asyncio.sleep(2.0)
            load.stop.set()
            await runner
            stats = await _get(s, f"{admin.group(1)}/stats")
            rl_text = await _get(s, urls[0])
        assert load.statuses.get(200, 0) == load.total, (load.statuses, load.errors, marks)
        assert load.total > warm + 20
        after = _unrated(stats)
        assert after == before, (before, after, marks)
        decisions = sum(
            float(v)
            for v in re.findall(r'^tokenweir_ratelimit_decisions_total\{[^}]*\} (\S+)$', rl_text,
                                re.M)
        )  # fmt: skip
        assert decisions >= load.total  # every request got a rate-limit decision
    finally:
        await asyncio.to_thread(stop_up, proc)
