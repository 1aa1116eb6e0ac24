"""Prefill coalescing through real Envoy: four requests that start the same new document at
once, on three emulators at real speed that are busy decoding (a prefill takes tens of
milliseconds, and requests that arrive during a step are admitted together at the next), an
imbalance bound
loose enough that load does not split them. The first is the lead; the others are sent to its
replica and wait for its prefill (the filter server holds
their request bodies, Envoy's message timeout extended), so the emulator reports their document
cached instead of computing it four times."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from tests.helpers import free_port, wait_for_port
from tests.integration.mesh_harness import mesh
from tests.integration.test_picker_envoy import (
    _doc,
    _emulator,
    _free_port_block,
    _until,
    policy_text,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _policy(gw: int, fp: int, replicas: list[int]) -> str:
    return policy_text(
        gw, fp, replicas, message_timeout="200ms",
        # four requests on one replica of three: not moved for load
        routing=("coalesce_wait: 3s", "max_imbalance: 5"),
    )  # fmt: skip


async def test_requests_starting_one_document_together_prefill_it_once(tmp_path: Path) -> None:
    gw, fp = free_port(), free_port()
    replicas = await _free_port_block()
    children = [_emulator(tmp_path, i, p, time_scale=1.0) for i, p in enumerate(replicas)]
    app: FilterApp | None = None
    try:
        for p in replicas:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        async with mesh(tmp_path, _policy(gw, fp, replicas), {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            picker = app.pickers.get("chat")
            assert picker is not None
            names = [f"127.0.0.1:{p}" for p in replicas]
            await _until(
                lambda: all(picker.index.known(n, time.monotonic()) for n in names),
                lambda: "replicas not known to the index",
            )
            url = f"http://127.0.0.1:{gw}/generate"
            doc = _doc("charter", 3000)  # ~3000 tokens: a prefill of tens of ms at real speed
            async with aiohttp.ClientSession() as http:

                async def generate(q: str) -> tuple[int, int]:
                    body = {"text": f"{doc} {q}", "sampling_params": {"max_new_tokens": 2}}
                    async with http.post(url, json=body) as r:
                        data = await r.json() if r.status == 200 else {}
                        return r.status, int(data.get("meta_info", {}).get("cached_tokens", 0))

                async def busy(i: int) -> None:  # a long answer: the replica steps all along
                    body = {"text": f"busy {i}", "sampling_params": {"max_new_tokens": 600}}
                    async with http.post(url, json=body) as r:
                        await r.read()

                # every replica mid-step: requests arriving together are admitted together at
                # its next step, where none finds the others' prefill (the case coalescing is for)
                background = [asyncio.create_task(busy(i)) for i in range(3)]
                await _until(
                    lambda: sorted(picker.inflight.values()) == [1, 1, 1],
                    lambda: str(picker.inflight),
                )
                await asyncio.sleep(0.3)
                got = await asyncio.gather(*(generate(f"question {i}") for i in range(4)))
                for t in background:
                    t.cancel()
                await asyncio.gather(*background, return_exceptions=True)
            assert [s for s, _ in got] == [200] * 4, got
            cached = sorted(c for _, c in got)
            # the lead computed the document; the three that waited for it found it cached
            assert cached[0] < 2000 and all(c >= 2900 for c in cached[1:]), cached
            reg = app.metrics.registry
            waited = sum(
                reg.get_sample_value(
                    "tokenweir_picker_coalesced_total", {"pool": "chat", "outcome": o}
                )
                or 0.0
                for o in ("indexed", "stored", "ended")
            )
            assert waited == 3, waited
    finally:
        if app is not None:
            await app.aclose()
        for c in children:
            c.close()
