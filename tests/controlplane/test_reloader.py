"""The reloader: publishes good edits, keeps the last good snapshot on bad ones, debounces."""

from __future__ import annotations

import asyncio
import os
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


async def test_a_hostile_edit_then_a_fix_is_picked_up(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, "127.0.0.1:9001")
    cache, registry = SnapshotCache(), CollectorRegistry()
    reloader = Reloader(path, cache, registry=registry, debounce=0.02, poll_interval=0.01)
    assert (await reloader.start()).ok
    try:
        first = cache.get("edge")
        path.write_text("version: 1\nplanner: " + "[" * 3000 + "]" * 3000 + "\n")
        await _until(lambda: _count(registry, "error") == 1)
        assert cache.get("edge") is first
        _write(path, "127.0.0.1:9005")
        await _until(lambda: "9005" in str(cache.get("edge").resources))  # type: ignore[union-attr]
        assert registry.get_sample_value("tokenweir_config_last_reload_error") == 0
    finally:
        await reloader.aclose()


def test_the_injected_service_check_refuses_and_keeps_the_last_good(tmp_path: Path) -> None:
    from tokenweir.check import service_issues

    path = tmp_path / "mesh.yaml"
    policy = (
        "version: 1\nfilters: {{address: 127.0.0.1:18082}}\n"
        "pools:\n  chat: {{models: [m], endpoints: [127.0.0.1:9001]}}\n"
        "gateways:\n  edge:\n    listen: 127.0.0.1:10000\n    routes:\n"
        "      - {{name: r, pool: chat, filters: {{plugins: [{plugin}]}}}}\n"
    )
    path.write_text(policy.format(plugin="usage"))
    cache, registry = SnapshotCache(), CollectorRegistry()
    reloader = Reloader(path, cache, registry=registry, check=service_issues)
    assert reloader.reload().ok
    good = cache.get("edge")
    path.write_text(policy.format(plugin="{name: usage, settings: {max_json_bytes: lots}}"))
    result = reloader.reload()
    assert not result.ok and cache.get("edge") is good
    assert result.problems == (
        f"{path}:9: gateways.edge.routes[0].filters.plugins[0]: the filter server refuses plugin "
        "'usage': usage: max_json_bytes must be a positive integer, got 'lots'",
    )
    unchecked = Reloader(path, SnapshotCache(), registry=CollectorRegistry())
    assert unchecked.reload().ok  # what the control plane accepted before the check


async def test_the_first_load_is_built_here_and_later_ones_in_the_build_worker(
    tmp_path: Path,
) -> None:
    """Nothing is served before the first load, so it runs at this process's own priority: in
    the build worker (lowered priority) a start-up on a busy host waited for idle CPU, 50-90 s.
    Reloads, with requests being served, still go to the worker."""
    path = tmp_path / "mesh.yaml"
    _write(path, "127.0.0.1:9001")
    cache, registry = SnapshotCache(), CollectorRegistry()
    reloader = Reloader(
        path, cache, registry=registry, debounce=0.05, poll_interval=0.01,
        build_worker="tests.runtime.build_targets:prepare_noting_pid",
    )  # fmt: skip
    pids = tmp_path / "mesh.yaml.pids"
    try:
        assert (await reloader.start()).ok
        assert pids.read_text().split() == [str(os.getpid())]
        first = cache.get("edge")
        _write(path, "127.0.0.1:9001, 127.0.0.1:9002")
        await _until(lambda: cache.get("edge") is not first, timeout=60.0)
        built_by = pids.read_text().split()
        assert len(built_by) == 2 and built_by[1] != str(os.getpid()), built_by
    finally:
        await reloader.aclose()
