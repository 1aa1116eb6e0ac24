"""The shared policy watcher never dies: any failure is logged once, counted, and survived."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from policy import Policy, load_policy
from runtime.watcher import Loaded, PolicyWatcher, ReloadMetrics

GOOD = "version: 1\ntiers: {{std: {{max_tokens: {n}}}}}\n"
DEEP = "version: 1\nplanner: " + "{a: " * 600 + "1" + "}" * 600 + "\n"
BOMB = "version: 1\nplanner:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  l{i}: &l{i} [{', '.join([f'*{p}'] * 10)}]\n"
    for i, p in enumerate(["a"] + [f"l{j}" for j in range(20)])
)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class _Owner:
    """What a service does: load (in a thread) and swap (on the loop)."""

    def __init__(self, fail_with: list[BaseException]) -> None:
        self.applied: list[int] = []
        self.load_threads: list[str] = []
        self.fail_with = fail_with

    def load(self, path: Path) -> Loaded[Policy]:
        self.load_threads.append(threading.current_thread().name)
        if self.fail_with:
            raise self.fail_with.pop(0)
        return Loaded(load_policy(path))

    def apply(self, policy: Policy) -> None:
        self.applied.append(policy.tiers["std"].max_tokens)


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def _until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.01)


def _watcher(path: Path, owner: _Owner, registry: CollectorRegistry) -> PolicyWatcher[Policy]:
    return PolicyWatcher(
        path,
        load=owner.load,
        apply=owner.apply,
        metrics=ReloadMetrics(registry),
        log=logging.getLogger("test.watcher"),
        poll_interval=0.01,
        debounce=0.02,
        clock=lambda: 1234.0,
    )


@pytest.mark.parametrize("hostile", [DEEP, BOMB, "version: 1\nx: !!python/name:os.system\n"])
async def test_a_hostile_edit_then_a_fix_is_picked_up(
    tmp_path: Path, hostile: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    owner, registry = _Owner([]), CollectorRegistry()
    watcher = _watcher(path, owner, registry)
    assert watcher.reload_now().ok
    watcher.start()
    try:
        _write(path, hostile)
        await _until(lambda: _value(registry, "tokenweir_config_reloads_total", result="error"))
        assert _value(registry, "tokenweir_config_last_reload_error") == 1
        assert owner.applied == [1]
        rejected = [r for r in caplog.records if "policy rejected" in r.getMessage()]
        assert len(rejected) == 1 and f"{path}:" in rejected[0].getMessage()
        assert not any(r.exc_info for r in caplog.records)  # a reason, not a traceback
        _write(path, GOOD.format(n=2))
        await _until(lambda: owner.applied == [1, 2])
        assert _value(registry, "tokenweir_config_last_reload_error") == 0
        assert _value(registry, "tokenweir_config_last_reload_success_timestamp_seconds") == 1234
    finally:
        await watcher.aclose()


@pytest.mark.parametrize(
    "error", [RecursionError("deep"), MemoryError(), KeyError("x"), ValueError("bad plugin")]
)
async def test_any_exception_while_building_is_survived(tmp_path: Path, error: Exception) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    owner, registry = _Owner([error]), CollectorRegistry()
    watcher = _watcher(path, owner, registry)
    watcher.start()
    try:
        _write(path, GOOD.format(n=2))
        await _until(lambda: _value(registry, "tokenweir_config_reloads_total", result="error"))
        assert owner.applied == []
        _write(path, GOOD.format(n=3))
        await _until(lambda: owner.applied == [3])
    finally:
        await watcher.aclose()


async def test_a_failing_swap_is_survived_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    registry = CollectorRegistry()
    calls: list[int] = []

    def apply(policy: Policy) -> None:
        calls.append(policy.tiers["std"].max_tokens)
        if len(calls) == 1:
            raise RuntimeError("swap failed")

    watcher = PolicyWatcher(
        path,
        load=lambda p: Loaded(load_policy(p)),
        apply=apply,
        metrics=ReloadMetrics(registry),
        log=logging.getLogger("test.watcher"),
        poll_interval=0.01,
        debounce=0.02,
    )
    assert not (await watcher.reload()).ok
    watcher.start()
    try:
        _write(path, GOOD.format(n=5))
        await _until(lambda: calls == [1, 5])
        assert _value(registry, "tokenweir_config_reloads_total", result="ok") == 1
    finally:
        await watcher.aclose()


async def test_loading_runs_off_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    owner = _Owner([])
    watcher = _watcher(path, owner, CollectorRegistry())
    assert (await watcher.reload()).ok
    assert owner.load_threads and owner.load_threads[0] != threading.current_thread().name


async def test_endpoint_files_named_by_the_policy_are_watched(tmp_path: Path) -> None:
    path, eps = tmp_path / "mesh.yaml", tmp_path / "eps"
    _write(path, GOOD.format(n=1))
    eps.write_text("127.0.0.1:1\n")
    loads: list[str] = []

    def load(p: Path) -> Loaded[str]:
        loads.append(eps.read_text())
        return Loaded(eps.read_text(), (eps,))

    watcher = PolicyWatcher(
        path,
        load=load,
        apply=lambda _v: None,
        metrics=ReloadMetrics(CollectorRegistry()),
        log=logging.getLogger("test.watcher"),
        poll_interval=0.01,
        debounce=0.02,
    )
    watcher.reload_now()
    watcher.start()
    try:
        _write(eps, "127.0.0.1:2\n")
        await _until(lambda: loads[-1] == "127.0.0.1:2\n")
        assert len(loads) == 2
    finally:
        await watcher.aclose()


async def test_an_unchanged_bad_file_is_not_reported_again(tmp_path: Path) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    owner, registry = _Owner([]), CollectorRegistry()
    watcher = _watcher(path, owner, registry)
    watcher.reload_now()
    watcher.start()
    try:
        _write(path, "version: 2\n")
        await _until(lambda: _value(registry, "tokenweir_config_reloads_total", result="error"))
        assert not watcher.changed()
        assert _value(registry, "tokenweir_config_reloads_total", result="error") == 1
    finally:
        await watcher.aclose()


async def test_the_collector_pauses_while_building_and_is_restored(tmp_path: Path) -> None:
    """A full collection during a 10k-tenant build held the GIL for seconds (ext_proc 504s)."""
    import gc
    import sys

    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    seen: list[tuple[bool, float]] = []

    def load(p: Path) -> Loaded[Policy]:
        seen.append((gc.isenabled(), sys.getswitchinterval()))
        return Loaded(load_policy(p))

    watcher = PolicyWatcher(
        path,
        load=load,
        apply=lambda _p: None,
        metrics=ReloadMetrics(CollectorRegistry()),
        log=logging.getLogger("test.watcher"),
    )
    interval = sys.getswitchinterval()
    assert gc.isenabled()
    assert (await watcher.reload()).ok
    assert seen[0][0] is False and seen[0][1] < interval
    assert gc.isenabled() and sys.getswitchinterval() == interval
    gc.unfreeze()
