"""Reloads fail nothing: a 10,000-tenant, 100-route policy is reloaded while a steady loop of
requests runs through real Envoy, the filter server, the rate-limit service and the SGLang
emulator (all started by ``tokenweir up``): no request fails, none passes unrated.

At Envoy's default timeouts (ext_proc 200 ms per message, rate limit 50 ms): with the build in
a thread of each serving process this failed 75 of 1,761 requests (ext_proc 504s) on a quiet
machine, and 13 failed + 192 unrated of 1,086 on the shared box at load 3-4 per core; the build
now runs in each process's build worker (runtime/buildworker.py): 6 failed + 22 unrated of 1,975
there, back to back. A box busier than 1.5 per core misses these deadlines even without a
reload, so the test skips there. The 500s a quiet CI machine saw were the HTTP/2 transport's
rapid-reset guard closing Envoy's connection to the filter server (Envoy resets every ext_proc
stream after its answers); only premature resets count now. The last unrated requests (16 on
a quiet box) were rate-limit calls past 50 ms while the rate-limit service built in a thread;
it builds in its worker too since its shutdown hang was found (a lost cancellation in the Redis
seeder): 0 failed, 0 unrated, 3 runs of 3 (docs/benchmarks.md, issue 9)."""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from pathlib import Path

import aiohttp
import pytest

from tests.bigpolicy import big_policy_text
from tests.helpers import free_port
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.timeout(600)]
TENANTS, ROUTES, KEYS = 10_000, 100, 100  # requests use the first KEYS tenants' keys


@pytest.fixture(autouse=True)
def _builds_at_their_own_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this test checks is the build worker's low priority (tests/conftest.py lifts it)."""
    monkeypatch.delenv("TOKENWEIR_BUILD_NICE", raising=False)


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


LOGS = ("filters.log", "ratelimit.log")


def _reloads(log: Path) -> int:
    """Policy reloads a service has applied, from its log."""
    return log.read_text().count("policy reloaded") if log.exists() else 0


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
                    if not _good(r.status) and len(self.errors) < 10:
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

    def reset(self) -> dict[int, int]:
        """Start counting again; what was counted so far."""
        counted, self.statuses, self.errors = self.statuses, {}, []
        return counted

    @property
    def failed(self) -> dict[int, int]:
        """Every answer that is neither a success nor a quota refusal (-1: no answer at all)."""
        return {s: n for s, n in self.statuses.items() if not _good(s)}


def _good(status: int) -> bool:
    return 200 <= status < 300 or status == 429


def _busy() -> str | None:
    """Why this box cannot judge Envoy's default timeouts, if it cannot: the test then skips.

    On the shared 2-core box, with other work at a load of 7 per core, a few requests per
    thousand missed 200 ms (ext_proc) or 50 ms (rate limit) with or without a reload. The load
    is what runs now (the kernel's count of runnable tasks, sampled over 2 s, less this
    process), not the load average: `make test` runs this test right after the parallel phase,
    whose load the 1-minute average still held, and the test skipped on a quiet box."""
    cores = os.cpu_count() or 1
    load = _runnable_now() / cores
    return (
        f"load {load:.1f} per core: too busy to judge 200 ms / 50 ms deadlines"
        if load > 1.5
        else None
    )


def _runnable_now(seconds: float = 2.0, every: float = 0.1) -> float:
    """The mean number of other tasks runnable (running or waiting for a CPU) over ``seconds``,
    from /proc/stat's ``procs_running``; the 1-minute load average where there is none."""
    samples: list[int] = []
    for _ in range(round(seconds / every)):
        try:
            with open("/proc/stat") as stat:
                running = next(ln for ln in stat if ln.startswith("procs_running"))
        except (OSError, StopIteration):
            return os.getloadavg()[0]
        samples.append(int(running.split()[1]) - 1)  # this process, reading it
        time.sleep(every)
    return sum(samples) / len(samples)


async def test_a_10k_tenant_reload_under_load_fails_nothing(tmp_path: Path) -> None:
    if reason := _busy():
        pytest.skip(reason)
    names = ("xds", "cp_metrics", "listen", "ratelimit", "rl_metrics", "filters", "filters_metrics")
    ports = {n: free_port() for n in names}
    backend = ("127.0.0.1", free_port())
    path = tmp_path / "mesh.yaml"

    def write(tenants: int, generation: int) -> None:
        # Envoy's default timeouts: ext_proc 200 ms per message, rate limit 50 ms.
        text = big_policy_text(
            tenants=tenants, routes=ROUTES, ports=ports, backend=backend, emulated=True,
            generation=generation, rl_timeout="50ms", message_timeout="200ms",
        )  # fmt: skip
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)

    write(KEYS, 0)  # start small (start-up is not what is measured), then reload to 10k
    run = tmp_path / "run"
    proc, banner = await asyncio.to_thread(start_up, path, run, 240.0)
    try:
        assert "ready" in banner, banner
        admin = re.search(r"admin (http://\S+)", banner)
        assert admin, banner
        urls = [f"http://127.0.0.1:{ports[p]}/metrics" for p in ("rl_metrics", "filters_metrics")]
        load = _Load(f"http://127.0.0.1:{ports['listen']}", workers=6)
        runner = asyncio.create_task(load.run())
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(3.0)  # cold start: connections open (not counted)
            cold = load.reset()
            before = _unrated(await _get(s, f"{admin.group(1)}/stats"))
            await asyncio.sleep(3.0)  # the same load, no reload: what this box can do
            warm = load.total
            assert warm > 20, (cold, load.statuses, load.errors)
            assert not load.failed, ("before any reload: box too busy?", load.statuses, load.errors)
            marks = [f"{time.strftime('%H:%M:%S')} first write"]
            for generation in (1, 2):  # 100 -> 10k tenants, then 10k with every quota changed
                write(TENANTS, generation)
                deadline = time.monotonic() + 300
                # their logs say when (a /metrics page costs the serving loop tens of ms)
                while not all(_reloads(run / f) >= generation for f in LOGS):
                    assert time.monotonic() < deadline, "the new policy was not applied"
                    await asyncio.sleep(0.2)
                marks.append(f"{time.strftime('%H:%M:%S')} generation {generation} applied")
            await asyncio.sleep(2.0)
            load.stop.set()
            await runner
            stats = await _get(s, f"{admin.group(1)}/stats")
            rl_text = await _get(s, urls[0])
        assert not load.failed, (load.statuses, load.errors, marks)
        assert load.total > warm + 20
        after = _unrated(stats)
        assert after == before, (before, after, marks)
        decisions = sum(
            float(v)
            for v in re.findall(r'^tokenweir_ratelimit_decisions_total\{[^}]*\} (\S+)$', rl_text,
                                re.M)
        )  # fmt: skip
        assert decisions >= load.total, (decisions, load.total)  # every request was rated
    finally:
        await asyncio.to_thread(stop_up, proc)
