"""The reloader: publishes good edits, keeps the last good snapshot on bad ones, debounces."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from controlplane.reloader import Reloader
from controlplane.xds.cache import SnapshotCache

POLICY = """version: 1
pools:
  chat: {{models: [m], endpoints: [{eps}]}}
gateways:
  edge: {{listen: 127.0.0.1:10000, routes: [{{name: r, pool: chat}}]}}
"""


def _write(path: Path, eps: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(POLICY.format(eps=eps))
    tmp.replace(path)


def _count(registry: CollectorRegistry, result: str) -> float:
    return registry.get_sample_value("tokenweir_config_reloads_total", {"result": result}) or 0.0


async def _until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.01)


async def test_good_edit_publishes_bad_edit_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, "127.0.0.1:9001")
    cache, registry = SnapshotCache(), CollectorRegistry()
    reloader = Reloader(path, cache, registry=registry, debounce=0.05, poll_interval=0.01)
    assert (await reloader.start()).ok
    try:
        first = cache.get("edge")
        assert first is not None
        _write(path, "127.0.0.1:9001, 127.0.0.1:9002")
        await _until(lambda: cache.get("edge") is not first)
        second = cache.get("edge")
        assert second is not None and second.version != first.version
        path.write_text("version: 1\npools:\n  chat: {models: [m], endpoints: [nope]}\n")
        await _until(lambda: _count(registry, "error") == 1)
        assert cache.get("edge") is second
        assert registry.get_sample_value("tokenweir_config_last_reload_error") == 1
    finally:
        await reloader.aclose()


async def test_a_burst_of_writes_is_one_reload(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, "127.0.0.1:9001")
    cache, registry = SnapshotCache(), CollectorRegistry()
    reloader = Reloader(path, cache, registry=registry, debounce=0.3, poll_interval=0.01)
    await reloader.start()
    try:
        ok_before = _count(registry, "ok")
        for port in range(9002, 9012):
            _write(path, f"127.0.0.1:{port}")
            await asyncio.sleep(0.02)
        await _until(lambda: _count(registry, "ok") > ok_before)
        await asyncio.sleep(0.5)
        assert _count(registry, "ok") == ok_before + 1
        assert "9011" in str(cache.get("edge").resources)  # type: ignore[union-attr]
    finally:
        await reloader.aclose()


async def test_unchanged_content_is_not_republished(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, "127.0.0.1:9001")
    cache, registry = SnapshotCache(), CollectorRegistry()
    reloader = Reloader(path, cache, registry=registry)
    reloader.reload()
    gen = cache.generation("edge")
    path.write_text(path.read_text() + "\n# a comment only\n")
    assert reloader.reload().ok
    assert cache.generation("edge") == gen
    assert _count(registry, "unchanged") == 1
