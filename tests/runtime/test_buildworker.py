"""Policy builds in the build worker process: reported like before, survived, restarted.

With the build in a thread of the serving process, a 10,000-tenant reload held the GIL for
seconds and failed requests at Envoy's default timeouts (tests/integration/
test_reload_under_load.py); these tests pin the worker's behaviour without timing anything.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from policy import Policy
from runtime.buildworker import NICE_ENV, BuildWorker
from runtime.errors import BuildFailed, BuildTimeout, WorkerCrashed
from runtime.watcher import InWorker, PolicyWatcher, ReloadMetrics

GOOD = "version: 1\ntiers: {{std: {{max_tokens: {n}}}}}\n"
BAD = "version: 1\ntiers:\n  std:\n    max_tokens: -5\n"  # line 4: out of range


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


class _Owner:
    def __init__(self) -> None:
        self.applied: list[int] = []

    def finish(self, policy: Policy) -> Policy:
        return policy

    def apply(self, policy: Policy) -> None:
        self.applied.append(policy.tiers["std"].max_tokens)


def _watcher(
    path: Path, owner: _Owner, registry: CollectorRegistry, target: str
) -> PolicyWatcher[Policy]:
    return PolicyWatcher(
        path,
        load=InWorker(f"tests.runtime.build_targets:{target}", owner.finish, timeout=60),
        apply=owner.apply,
        metrics=ReloadMetrics(registry),
        log=logging.getLogger("test.buildworker"),
        poll_interval=0.01,
        debounce=0.02,
        clock=lambda: 1234.0,
    )


async def test_the_build_runs_in_another_process_at_a_lower_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NICE_ENV, raising=False)  # tests/conftest.py sets it for the suite
    path = tmp_path / "mesh.yaml"
    path.write_text("")
    worker = BuildWorker("tests.runtime.build_targets:pid_and_nice", nice=5)
    try:
        (pid, nice), files, _parts = await worker.build(path)
    finally:
        await worker.aclose()
    assert pid != os.getpid()
    assert nice == os.nice(0) + 5 or nice == 19
    assert files == ()


async def test_the_operators_override_sets_the_workers_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(NICE_ENV, "0")  # builds compete as equals
    path = tmp_path / "mesh.yaml"
    path.write_text("")
    worker = BuildWorker("tests.runtime.build_targets:pid_and_nice", nice=5)
    try:
        (_pid, nice), _files, _parts = await worker.build(path)
    finally:
        await worker.aclose()
    assert nice == os.nice(0)


async def test_a_large_value_comes_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "n"
    path.write_text("5000")
    worker = BuildWorker("tests.runtime.build_targets:tenant_table")
    try:
        value, _files, parts = await worker.build(path)
    finally:
        await worker.aclose()
    assert value["tenants"]["t4999"] == (4999, "k4999") and len(value["tenants"]) == 5000
    assert value["order"] == list(range(5000))
    assert sorted(len(p) for p in parts) == [5000, 5000]  # both arrived in slices


async def test_a_rejected_edit_is_reported_with_file_and_line_and_the_old_policy_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    owner, registry = _Owner(), CollectorRegistry()
    watcher = _watcher(path, owner, registry, "policy")
    try:
        assert (await watcher.reload()).ok
        _write(path, BAD)
        out = await watcher.reload()
        assert not out.ok
        assert any(p.startswith(f"{path.resolve()}:4: tiers.std.max_tokens:") for p in out.problems)
        assert owner.applied == [1]  # the last good policy keeps serving
        assert _value(registry, "tokenweir_config_last_reload_error") == 1
        logged = [r.getMessage() for r in caplog.records if "policy rejected" in r.getMessage()]
        assert logged and f"{path.resolve()}:4:" in logged[0]
        assert not any(r.exc_info for r in caplog.records)
        _write(path, GOOD.format(n=2))
        assert (await watcher.reload()).ok
        assert owner.applied == [1, 2]
        assert _value(registry, "tokenweir_config_last_reload_error") == 0
        assert _value(registry, "tokenweir_config_build_worker_restarts_total") == 0
    finally:
        await watcher.aclose()


async def test_a_worker_that_dies_is_restarted_counted_and_the_build_retried(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    owner, registry = _Owner(), CollectorRegistry()
    watcher = _watcher(path, owner, registry, "crash_on_marker")
    try:
        assert (await watcher.reload()).ok
        path.with_name("mesh.yaml.crash").write_text("once\n")
        _write(path, GOOD.format(n=2))
        assert (await watcher.reload()).ok  # crashed, restarted, built again
        assert owner.applied == [1, 2]
        assert _value(registry, "tokenweir_config_build_worker_restarts_total") == 1
    finally:
        await watcher.aclose()


async def test_a_worker_that_keeps_dying_fails_the_reload_not_the_watcher(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mesh.yaml"
    _write(path, GOOD.format(n=1))
    owner, registry = _Owner(), CollectorRegistry()
    watcher = _watcher(path, owner, registry, "crash_on_marker")
    assert (await watcher.reload()).ok
    watcher.start()
    try:
        path.with_name("mesh.yaml.crash").write_text("1\n2\n")
        _write(path, GOOD.format(n=2))
        while not _value(registry, "tokenweir_config_reloads_total", result="error"):
            await asyncio.sleep(0.02)
        assert owner.applied == [1]
        # 137 as the worker exited; asyncio reports 255 when its child watcher lost the race to
        # reap it (seen once in a fresh-clone CI run): either way the death is reported
        assert any("build worker died (exit code" in r.getMessage() for r in caplog.records)
        _write(path, GOOD.format(n=3))  # the next edit is built by a new worker
        while owner.applied != [1, 3]:
            await asyncio.sleep(0.02)
        assert _value(registry, "tokenweir_config_build_worker_restarts_total") == 2
        assert _value(registry, "tokenweir_config_last_reload_error") == 0
    finally:
        await watcher.aclose()


async def test_a_build_past_its_time_limit_is_killed_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "seconds"
    path.write_text("30")
    worker = BuildWorker("tests.runtime.build_targets:slow", timeout=5)
    try:
        with pytest.raises(BuildTimeout) as caught:
            await worker.build(path)
        assert "took longer than 5 s" in caught.value.problems[0]
        # the new worker's start-up (imports at SCHED_IDLE) is not what this test times: on a
        # loaded 2-core box it took over 5 s about one run in four, before and after #35
        worker.timeout = 60.0
        path.write_text("0")
        assert (await worker.build(path))[0] == 0  # a new worker
        assert worker.restarts == 1
    finally:
        await worker.aclose()


async def test_a_killed_worker_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "seconds"
    path.write_text("30")
    worker = BuildWorker("tests.runtime.build_targets:slow")
    await worker.start()
    try:
        build = asyncio.create_task(worker.build(path))
        await asyncio.sleep(0.2)
        assert worker.pid is not None
        os.kill(worker.pid, 9)
        with pytest.raises(WorkerCrashed):
            await build
    finally:
        await worker.aclose()


def test_the_worker_errors_are_build_failures() -> None:
    err: Any = WorkerCrashed("x: the build worker died")
    assert isinstance(err, BuildFailed) and err.problems == ("x: the build worker died",)


async def test_closing_a_worker_that_gets_no_cpu_does_not_hang(tmp_path: Path) -> None:
    """The rate-limit service that never stopped (issue 9): after a 10k-tenant reload its
    worker, at SCHED_IDLE on a saturated box, got no CPU to read the end of its input and
    exit, and ``aclose`` waited for that exit without bound. A stopped child stands in for a
    starved one: closing waits a bounded time, then kills it."""
    import signal

    path = tmp_path / "mesh.yaml"
    path.write_text("")
    worker = BuildWorker("tests.runtime.build_targets:pid_and_nice")
    (pid, _nice), _files, _parts = await worker.build(path)
    os.kill(pid, signal.SIGSTOP)  # it cannot run: it will not see its input close
    await asyncio.wait_for(worker.aclose(), 15)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone (killed and reaped), not left stopped


def _autogroup() -> str:
    """This process's scheduling group (``/autogroup-N nice K``), or "" where the kernel has
    none or shows none (some sandboxes have the file but leave it empty)."""
    try:
        return Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return ""


@pytest.mark.skipif(not _autogroup(), reason="the kernel shows no scheduler autogroups")
async def test_the_worker_session_gets_the_lowest_cpu_weight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NICE_ENV, raising=False)  # tests/conftest.py sets it for the suite
    """Autogroups share the CPU between sessions: the worker's own session must weigh least,
    or three workers building at once outweigh the serving processes."""
    path = tmp_path / "mesh.yaml"
    path.write_text("")
    worker = BuildWorker("tests.runtime.build_targets:autogroup", nice=10)
    try:
        group, _files, _parts = await worker.build(path)
    finally:
        await worker.aclose()
    mine = _autogroup().split()[0]
    assert group.split()[0] != mine  # a session of its own
    assert group.endswith("nice 19"), group
