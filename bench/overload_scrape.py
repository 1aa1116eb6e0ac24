"""Server-side state of an overload arm while it runs (``bench/overload.py``): each emulator's
own view (``/_emulator/state``) and the queues on the backends' and the gateway's ``/metrics``,
scanned for the few series the benchmark plots."""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING, Any

import aiohttp

from poolstate.errors import MetricsTextError
from poolstate.metrics_text import parse_metrics_text

if TYPE_CHECKING:
    from overload_arms import Arm

__all__ = ["replica_states", "scrape"]


async def replica_states(http: aiohttp.ClientSession, arm: Arm) -> list[dict[str, Any] | None]:
    """Each emulator's own view now (``/_emulator/state``: priorities running, prefilling and
    waiting, preemptions so far); None for a replica that did not answer."""
    pages = await asyncio.gather(
        *(_get(http, u + "/_emulator/state") for u in arm.pool.urls), return_exceptions=True
    )
    return [json.loads(p) if isinstance(p, str) else None for p in pages]


async def scrape(http: aiohttp.ClientSession, arm: Arm) -> dict[str, float]:
    """Server-side queues now: backend waiting/running (summed) and the gateway's lane queues.

    The pages are scanned for the few series wanted (the backends' through the control plane's
    ``parse_metrics_text``, the gateway's by :func:`_samples`), not parsed whole: the
    client that measures latency runs on this loop, and parsing the filter server's full page
    every sample stalled it ~20 ms (its own loop-lag p99), which every latency percentile
    then carried."""
    out = {"backend_queued": 0.0, "backend_running": 0.0}
    pages = await asyncio.gather(
        *(_get(http, u + "/metrics") for u in arm.pool.urls),
        *([_get(http, arm.queue_metrics_url)] if arm.queue_metrics_url else []),
        return_exceptions=True,
    )
    for i, page in enumerate(pages):
        if not isinstance(page, str):
            continue
        if i < len(arm.pool.urls):
            try:
                sample = parse_metrics_text(page)  # the control plane's filtered parse
            except MetricsTextError:
                continue
            out["backend_queued"] += sample.queued or 0
            out["backend_running"] += sample.running or 0
            continue
        for name, labels, value in _samples(page, _GATEWAY):
            if name == "tokenweir_admission_in_flight":
                out["gateway_in_flight"] = out.get("gateway_in_flight", 0.0) + value
                continue
            kind = name.removeprefix("tokenweir_admission_")
            lane = _LANE.search(labels)
            key = f"gateway_{kind}_{lane.group(1) if lane else 'all'}"
            out[key] = out.get(key, 0.0) + value
    return out


_GATEWAY = (
    "tokenweir_admission_queued",
    "tokenweir_admission_reserved",
    "tokenweir_admission_in_flight",
)
_LANE = re.compile(r'lane="([^"]*)"')


def _samples(page: str, names: tuple[str, ...]) -> list[tuple[str, str, float]]:
    """(name, label text, value) of every sample line of ``names`` in a Prometheus text page."""
    out = []
    for line in page.splitlines():
        if not line.startswith(names):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        if name not in names:
            continue  # a longer name with the same prefix
        try:
            out.append((name, labels, float(value)))
        except ValueError:
            continue
    return out


async def _get(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=1.0)) as r:
        return await r.text()
