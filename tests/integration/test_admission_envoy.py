"""Priority admission on real Envoy: the filter server holds request headers in bounded lane
queues until the pool has a free slot. A backend that holds every request until the test lets
it go makes the order of admission visible without timing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from filters.app import FilterApp, Settings
from filters.plugins.admission.gate import PoolGate
from runtime.local_http import serve_any_path
from tests.helpers import free_port
from tests.integration.mesh_harness import mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEYS = {"alice": "alice-key-123", "bob": "bob-key-1234", "carol": "carol-key-123"}
KEYS |= {"dave": "dave-key-1234", "erin": "erin-key-1234"}


@dataclass
class HoldBackend:
    """Answers only when released; records who arrived, in order, and the peak concurrency."""

    port: int = 0
    arrivals: list[dict[str, str]] = field(default_factory=list)
    running: int = 0
    peak: int = 0
    gates: asyncio.Queue[None] = field(default_factory=asyncio.Queue)
    hold: bool = True
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner, self.port = await serve_any_path(self._handle, "127.0.0.1")

    async def _handle(self, request: web.Request) -> web.Response:
        if not request.path.startswith("/v1/"):  # the control plane's pool-state scrapes
            return web.Response(status=404)
        self.arrivals.append({k.lower(): v for k, v in request.headers.items()})
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            if self.hold:
                await self.gates.get()
            return web.json_response({"ok": True})
        finally:
            self.running -= 1

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.gates.put_nowait(None)

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def policy(
    gw: int, fp: int, backend: int, *, gateways: int = 1, cap: int = 2, leave: str = "0.25"
) -> str:
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:1, metrics: 127.0.0.1:2}}
filters: {{address: 127.0.0.1:{fp}, message_timeout: 500ms}}
admission:
  gateways: {gateways}
  interactive: {{ttft_budget: 20s, max_wait: 10s, max_queue: 4, max_queue_per_tenant: 2}}
  batch: {{ttft_budget: 60s, max_wait: 10s, max_queue: 4, max_queue_per_tenant: 2,
          leave_for_higher: {leave}}}
  tier_weights: {{pro: 1, free: 1}}
pools:
  chat:
    models: [m1]
    endpoints: [127.0.0.1:{backend}]
    capacity: {{max_running_requests: {cap}}}
    health_check: {{enabled: false}}
    retries: {{enabled: false}}
    outlier_detection: {{enabled: false}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - name: llm
        match: {{prefix: /v1/}}
        pool: chat
        filters: {{plugins: [identity, lane, admission]}}
tiers:
  free: {{lane: batch, allowed_lanes: [batch]}}
  pro: {{lane: interactive}}
tenants:
  alice: {{tier: pro, api_keys: [{KEYS["alice"]}]}}
  bob: {{tier: free, api_keys: [{KEYS["bob"]}]}}
  carol: {{tier: free, api_keys: [{KEYS["carol"]}]}}
  dave: {{tier: free, api_keys: [{KEYS["dave"]}]}}
  erin: {{tier: pro, api_keys: [{KEYS["erin"]}]}}
"""


@dataclass
class Gateway:
    url: str
    app: FilterApp

    @property
    def gate(self) -> PoolGate:
        g = self.app.gates.gate("chat")
        assert g is not None
        return g


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, backend: HoldBackend, **kw: Any) -> AsyncIterator[Gateway]:
    gw, fp = free_port(), free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    async with mesh(tmp_path, policy(gw, fp, backend.port, **kw), {"edge": gw}) as m:
        app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
        await app.start()
        try:
            yield Gateway(f"http://127.0.0.1:{gw}", app)
        finally:
            await app.aclose()


@contextlib.asynccontextmanager
async def started_backend() -> AsyncIterator[HoldBackend]:
    b = HoldBackend()
    await b.start()
    try:
        yield b
    finally:
        b.hold = False
        b.release(1000)
        await b.aclose()


Response = tuple[int, dict[str, str], str]


async def call(
    s: aiohttp.ClientSession,
    url: str,
    who: str,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Response:
    h = {"authorization": f"Bearer {KEYS[who]}", "content-type": "application/json"}
    async with s.post(
        f"{url}/v1/chat/completions",
        data=b"{}",
        headers=h | (headers or {}),
        timeout=aiohttp.ClientTimeout(total=timeout),
    ) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.text()


async def until(probe: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < end, "condition not reached"
        await asyncio.sleep(0.01)


def queued(g: Gateway, lane: str) -> int:
    return len(g.gate.core.queues[lane])


def assert_shed(resp: Response, status: int, code: str) -> None:
    got, headers, body = resp
    assert got == status, resp
    assert int(headers["retry-after"]) >= 1
    err = json.loads(body)["error"]
    assert err["code"] == code and err["message"]


async def test_bound_priority_fairness_spoofing_and_retry_after(tmp_path: Path) -> None:
    async with started_backend() as b, gateway(tmp_path, b) as g, aiohttp.ClientSession() as s:
        tasks: list[asyncio.Task[Response]] = []

        def send(who: str, **headers: str) -> asyncio.Task[Response]:
            t = asyncio.create_task(call(s, g.url, who, headers))
            tasks.append(t)
            return t

        send("dave"), send("dave")
        await until(lambda: b.running == 2)  # the pool's two slots are taken
        for n, who in enumerate(("bob", "bob", "carol", "carol"), start=1):
            send(who)
            await until(lambda n=n: queued(g, "batch") == n)
        # the batch queue is full (4): answered at once, with Retry-After and a JSON reason
        assert_shed(await call(s, g.url, "dave"), 503, "queue_full")
        # a batch tenant claiming the interactive lane is still queued as batch (and refused:
        # its lane is full), never ahead of anyone
        spoofed = {"x-lane": "interactive", "x-tokenweir-lane": "interactive"}
        assert_shed(await call(s, g.url, "dave", spoofed), 503, "queue_full")
        assert queued(g, "interactive") == 0
        send("alice")
        await until(lambda: queued(g, "interactive") == 1)
        # every freed slot: interactive first, then batch tenants in turn (equal weights)
        order = []
        for _ in range(5):
            before = len(b.arrivals)
            b.release()
            await until(lambda n=before: len(b.arrivals) == n + 1)
            order.append(b.arrivals[-1]["x-tokenweir-tenant"])
        assert order[0] == "alice"
        assert sorted(order[1:]) == ["bob", "bob", "carol", "carol"]
        assert order[1] != order[2] and order[3] != order[4]  # alternating: fair
        assert b.peak == 2  # never more than the pool's capacity
        b.hold = False
        b.release(10)
        results = await asyncio.gather(*tasks)
        assert all(r[0] == 200 for r in results)


async def test_a_deadline_header_does_not_move_a_request_forward(tmp_path: Path) -> None:
    async with started_backend() as b, gateway(tmp_path, b) as g, aiohttp.ClientSession() as s:
        held = [asyncio.create_task(call(s, g.url, "dave")) for _ in range(2)]
        await until(lambda: b.running == 2)
        first = asyncio.create_task(call(s, g.url, "alice"))
        await until(lambda: queued(g, "interactive") == 1)
        urgent = {"x-request-timeout-ms": "20000", "x-lane": "interactive", "priority": "0"}
        urgent["x-request-deadline-ms"] = str(int((time.time() + 15) * 1000))
        second = asyncio.create_task(call(s, g.url, "erin", urgent))
        await until(lambda: queued(g, "interactive") == 2)
        b.release()
        await until(lambda: len(b.arrivals) == 3)
        assert b.arrivals[-1]["x-tokenweir-tenant"] == "alice"  # arrival order, not deadline
        b.hold = False
        b.release(10)
        assert {r[0] for r in await asyncio.gather(*held, first, second)} == {200}


async def test_a_client_that_waits_as_told_gets_in(tmp_path: Path) -> None:
    async with started_backend() as b, gateway(tmp_path, b) as g, aiohttp.ClientSession() as s:
        b.hold = False
        for _ in range(6):  # the drain rate is measured from real completions
            assert (await call(s, g.url, "bob"))[0] == 200
        b.hold = True
        held = [asyncio.create_task(call(s, g.url, "dave")) for _ in range(2)]
        await until(lambda: b.running == 2)
        waiting = [asyncio.create_task(call(s, g.url, w)) for w in ("bob", "bob", "carol")]
        waiting.append(asyncio.create_task(call(s, g.url, "carol")))
        await until(lambda: queued(g, "batch") == 4)
        status, headers, _ = await call(s, g.url, "dave")
        assert status == 503
        wait_s = int(headers["retry-after"])
        b.hold = False
        b.release(2)
        await asyncio.sleep(wait_s)
        assert (await call(s, g.url, "dave"))[0] == 200
        assert {r[0] for r in await asyncio.gather(*held, *waiting)} == {200}


async def test_deadlines_never_reach_a_backend(tmp_path: Path) -> None:
    async with started_backend() as b, gateway(tmp_path, b) as g, aiohttp.ClientSession() as s:
        held = [asyncio.create_task(call(s, g.url, "alice")) for _ in range(2)]
        await until(lambda: b.running == 2)
        hits = len(b.arrivals)
        past = str(int((time.time() - 1) * 1000))
        assert_shed(
            await call(s, g.url, "alice", {"x-request-deadline-ms": past}),
            504,
            "deadline_exceeded",
        )
        t = asyncio.create_task(call(s, g.url, "alice", {"x-request-timeout-ms": "300"}))
        assert_shed(await t, 504, "deadline_exceeded")  # its deadline passed while it waited
        assert len(b.arrivals) == hits  # neither reached the backend
        assert queued(g, "interactive") == 0
        b.hold = False
        b.release(2)
        await asyncio.gather(*held)
        b.hold = True  # admitted, then held: Envoy ends it at the client's deadline
        # (without the propagation the route has no timeout: this call would time out)
        timed = {"x-request-timeout-ms": "1000"}
        status, _, body = await call(s, g.url, "alice", timed, timeout=15)
        assert status == 504 and "timeout" in body
        seen = b.arrivals[-1]
        assert 0 < int(seen["x-request-timeout-ms"]) <= 1000  # the remaining budget, upstream
        assert "x-request-deadline-ms" not in seen


async def test_an_aborted_waiter_frees_its_place(tmp_path: Path) -> None:
    async with started_backend() as b, gateway(tmp_path, b) as g, aiohttp.ClientSession() as s:
        held = [asyncio.create_task(call(s, g.url, "alice")) for _ in range(2)]
        await until(lambda: b.running == 2)
        gone = asyncio.create_task(call(s, g.url, "alice"))
        await until(lambda: queued(g, "interactive") == 1)
        gone.cancel()
        await until(lambda: queued(g, "interactive") == 0)
        b.hold = False
        b.release(2)
        await asyncio.gather(*held)
        await until(lambda: g.gate.core.in_flight == 0)  # slots freed at stream end


async def test_two_gateways_never_admit_more_than_the_pool_holds(tmp_path: Path) -> None:
    async with (
        started_backend() as b,
        gateway(tmp_path / "a", b, gateways=2, cap=4) as g1,
        gateway(tmp_path / "b", b, gateways=2, cap=4) as g2,
        aiohttp.ClientSession() as s,
    ):
        assert g1.gate.core.max_requests == g2.gate.core.max_requests == 2  # the split rule
        tasks = [
            asyncio.create_task(call(s, g.url, who))
            for g in (g1, g2)
            for who in ("alice", "bob", "carol", "alice", "bob", "carol")
        ]
        await until(lambda: queued(g1, "batch") + queued(g1, "interactive") == 4)
        await until(lambda: queued(g2, "batch") + queued(g2, "interactive") == 4)
        await until(lambda: b.running == 4)
        b.hold = False
        b.release(100)
        assert {r[0] for r in await asyncio.gather(*tasks)} == {200}
        assert b.peak == 4


async def test_expired_deadlines_never_reach_an_emulated_sglang(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from backends.emulator import EmulatorSettings, start_emulator

    emu = await start_emulator(EmulatorSettings(model="m1", profile="seed-2k", time_scale=1.0))
    fake = HoldBackend(port=emu.port)  # only its port: the policy points at the emulator
    try:
        async with gateway(tmp_path, fake, cap=1) as g, aiohttp.ClientSession() as s:

            async def finished() -> float:
                async with s.get(emu.url + "/metrics") as r:
                    text = await r.text()
                return sum(
                    x.value
                    for f in text_string_to_metric_families(text)
                    for x in f.samples
                    if x.name == "sglang:num_requests_total"
                )

            def chat(max_tokens: int) -> bytes:
                msg = {"role": "user", "content": "hello"}
                return json.dumps(
                    {"model": "m1", "messages": [msg], "max_tokens": max_tokens}
                ).encode()

            async def post(body: bytes, headers: dict[str, str]) -> Response:
                h = {"authorization": f"Bearer {KEYS['alice']}", "content-type": "application/json"}
                async with s.post(
                    f"{g.url}/v1/chat/completions", data=body, headers=h | headers
                ) as r:
                    return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.text()

            before = await finished()
            long = asyncio.create_task(post(chat(400), {}))  # holds the pool's only slot
            await until(lambda: g.gate.core.in_flight == 1)
            late = [post(chat(5), {"x-request-timeout-ms": "150"}) for _ in range(2)]
            for resp in await asyncio.gather(*late):
                assert_shed(resp, 504, "deadline_exceeded")
            assert (await long)[0] == 200
            assert await finished() == before + 1  # only the long one reached the emulator
    finally:
        await emu.aclose()


async def _interactive_demand(s: aiohttp.ClientSession, g: Gateway, b: HoldBackend) -> None:
    """Two interactive streams at a time, each held ~0.15 s, for a dozen rounds: the gate
    measures interactive as needing about two of the pool's slots."""
    for _ in range(12):
        pair = [asyncio.create_task(call(s, g.url, who)) for who in ("alice", "erin")]
        await until(lambda: b.running == 2)
        await asyncio.sleep(0.15)
        b.release(2)
        assert [r[0] for r in await asyncio.gather(*pair)] == [200, 200]


@pytest.mark.parametrize("leave", ["0.25", "null"])
async def test_batch_leaves_the_slots_interactive_is_measured_to_need(
    tmp_path: Path, leave: str
) -> None:
    """A batch burst on a pool of 4 that interactive was just using: with ``leave_for_higher``
    batch starts on fewer than 4 slots and a new interactive request starts at once, while
    batch requests wait; with it off (null) batch takes all 4 and interactive queues."""
    async with (
        started_backend() as b,
        gateway(tmp_path, b, cap=4, leave=leave) as g,
        aiohttp.ClientSession() as s,
    ):
        await _interactive_demand(s, g, b)
        batch = [asyncio.create_task(call(s, g.url, who)) for who in ("bob", "bob", "carol")]
        batch += [asyncio.create_task(call(s, g.url, "dave"))]
        await until(lambda: b.running + queued(g, "batch") == 4)
        await asyncio.sleep(0.2)  # every batch request has been seen: started or queued
        batch_running = b.running
        inter = asyncio.create_task(call(s, g.url, "alice"))
        if leave == "null":
            assert batch_running == 4
            await until(lambda: queued(g, "interactive") == 1)  # no slot: it waits
            b.release()
            await until(lambda: b.arrivals[-1]["x-tokenweir-tenant"] == "alice")
        else:
            assert 0 < batch_running < 4, batch_running
            assert queued(g, "batch") == 4 - batch_running
            await until(lambda: b.running == batch_running + 1)  # started without a release
            assert b.arrivals[-1]["x-tokenweir-tenant"] == "alice"
            assert queued(g, "interactive") == 0
        b.hold = False
        b.release(20)
        results = await asyncio.gather(inter, *batch)
        assert all(r[0] == 200 for r in results), results
