"""Predicted-latency scoring (``routing.scoring: predicted_ttft``) through real Envoy and three
emulators (slowed 20x: a prefill of 3,000 tokens takes about 2.4 s, so a backlog lasts while the
test looks at it). The pool has learned nothing yet (one request): the rates are the prior's,
one rate for all, and the decision is the least prefill work ahead of the first token, counted
exactly (the backlog without allowance, the cached tokens as the index knows them).

A document is cached on one replica ("the owner"). Then requests that extend it with new text
are sent, and go to the owner (the document saves them its prefill); while their prefill is the
owner's backlog, a short question on the document is sent:

- with three short extensions (~900 new tokens) queued, the owner is still predicted faster
  than prefilling the document elsewhere (~3,000 tokens): the question stays and finds it
  cached (main's weights move it: three in flight there is past their imbalance bound);
- with one long extension (~4,800 tokens) queued, the owner is predicted slower than a replica
  with nothing queued, even though that one must prefill the whole document: the question goes
  there (main's weights keep it: it is all cached there, past ``sticky_share``).

Both fail with ``scoring: weights`` (checked: there the extensions do not all stay on the owner).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from filters.app import FilterApp, Settings
from filters.plugins.picker.pool import PoolPicker
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

DOC = _doc("charter", 3000)  # ~3,000 tokens
ROUTING = ("pending_ttl: 0s", "scoring: predicted_ttft")
Generate = Callable[[str, int], Awaitable[int]]


@asynccontextmanager
async def _pool(tmp_path: Path) -> AsyncIterator[tuple[PoolPicker, FilterApp, Generate, str]]:
    """The mesh, its picker, a ``generate(text, max_new_tokens) -> cached tokens``, and the
    owner: the replica that holds DOC (cached by a first request)."""
    gw, fp = free_port(), free_port()
    replicas = await _free_port_block()
    children = [_emulator(tmp_path, i, p, time_scale=20.0) for i, p in enumerate(replicas)]
    app: FilterApp | None = None
    try:
        for p in replicas:
            await asyncio.to_thread(wait_for_port, p, 30.0)
        text = policy_text(gw, fp, replicas, message_timeout="2s", routing=ROUTING)
        async with mesh(tmp_path, text, {"edge": gw}) as m:
            app = FilterApp(Settings(policy_path=m.policy_path), clock=time.monotonic)
            await app.start()
            picker = app.pickers.get("chat")
            assert picker is not None
            names = [f"127.0.0.1:{p}" for p in replicas]
            now = time.monotonic
            await _until(
                lambda: all(picker.index.known(n, now()) for n in names),
                lambda: "replicas not known to the index",
            )
            url = f"http://127.0.0.1:{gw}/generate"
            async with aiohttp.ClientSession() as http:

                async def generate(text: str, tokens: int = 2) -> int:
                    body = {"text": text, "sampling_params": {"max_new_tokens": tokens}}
                    async with http.post(url, json=body) as r:
                        assert r.status == 200, await r.text()
                        data = await r.json()
                        return int(data["meta_info"].get("cached_tokens", 0))

                await generate(DOC + " first question")
                owner: list[str] = []

                def held() -> bool:
                    counts = picker._held(picker.prompt(DOC.encode()).points, now())
                    owner[:] = [n for n, c in counts.items() if c and c >= 40]
                    return len(picker.prompt(DOC.encode()).points) >= 40 and bool(owner)

                await _until(held, lambda: "no replica holds the document yet")
                await _until(lambda: not any(picker.inflight.values()), lambda: "in flight")
                yield picker, app, generate, owner[0]
    finally:
        if app is not None:
            await app.aclose()
        for c in children:
            c.close()


async def _with_backlog(
    picker: PoolPicker, generate: Generate, owner: str, extensions: list[int]
) -> tuple[int, list[asyncio.Task[int]]]:
    """Send DOC extended by each of ``extensions`` new words; once all are in flight on the
    owner, a short question on DOC: its cached tokens (and the extensions' tasks)."""
    tasks = [
        asyncio.create_task(generate(DOC + " " + _doc(f"ext{i}x", n)))
        for i, n in enumerate(extensions)
    ]
    await _until(
        lambda: picker.inflight.get(owner, 0) >= len(extensions),
        lambda: f"extensions not all sent to the owner: {picker.inflight}",
        timeout=20,
    )
    assert picker.backlog[owner] >= 0.8 * sum(extensions), picker.backlog
    return await generate(DOC + " a short question"), tasks


def _picks(app: FilterApp, reason: str) -> float:
    got = app.metrics.registry.get_sample_value(
        "tokenweir_picker_picks_total", {"pool": "chat", "reason": reason}
    )
    return got or 0.0


async def test_a_question_stays_with_its_cache_behind_a_short_backlog(tmp_path: Path) -> None:
    async with _pool(tmp_path) as (picker, _app, generate, owner):
        cached, tasks = await _with_backlog(picker, generate, owner, [300, 300, 300])
        # ~900 tokens queued there against ~3,000 to prefill anywhere else: right to stay
        assert cached >= 2900, cached
        assert all(c >= 2900 for c in await asyncio.gather(*tasks))  # they had DOC cached


async def test_a_question_leaves_its_cache_behind_a_long_backlog(tmp_path: Path) -> None:
    async with _pool(tmp_path) as (picker, app, generate, owner):
        loads = _picks(app, "load")
        cached, tasks = await _with_backlog(picker, generate, owner, [4800])
        # ~4,800 tokens queued on the owner against ~3,000 on an idle replica: it went there
        assert cached < 100, cached
        assert _picks(app, "load") == loads + 1
        assert all(c >= 2900 for c in await asyncio.gather(*tasks))
