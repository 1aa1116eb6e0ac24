"""Shutting down after a policy watcher crashed: no exception, no traceback (one log line).

Observed on main before: a watcher that died of a RecursionError (a deeply nested YAML edit)
re-raised it from ``aclose`` and shutdown printed a 3,000-line traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controlplane.reloader import Reloader
from controlplane.xds.cache import SnapshotCache
from filters.app import FilterApp, Settings
from policy import load_policy
from ratelimit_service.server import Service, ServiceSettings

POLICY = """version: 1
pools:
  chat: {models: [m], endpoints: [127.0.0.1:9]}
gateways:
  edge: {listen: 127.0.0.1:10000, routes: [{name: r, pool: chat}]}
"""


async def _crashed() -> asyncio.Task[None]:
    async def watch() -> None:
        raise RecursionError("maximum recursion depth exceeded while calling a Python object")

    task = asyncio.create_task(watch(), name="policy-watcher")
    await asyncio.sleep(0)
    assert task.done()
    return task


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    path = tmp_path / "mesh.yaml"
    path.write_text(POLICY)
    return path


def _one_line_error(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].exc_info is None and "RecursionError" in errors[0].getMessage()


async def test_control_plane_reloader(policy_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reloader = Reloader(policy_path, SnapshotCache(), registry=CollectorRegistry())
    reloader.watcher._task = await _crashed()
    with caplog.at_level(logging.ERROR):
        await reloader.aclose()
    _one_line_error(caplog)


async def test_filter_server(policy_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = FilterApp(Settings(policy_path=policy_path), clock=time.monotonic)
    app.watcher._task = await _crashed()
    with caplog.at_level(logging.ERROR):
        await app.aclose()
    _one_line_error(caplog)


async def test_rate_limit_service(policy_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    svc = Service(ServiceSettings(policy_path=policy_path), load_policy(policy_path))
    svc.watcher._task = await _crashed()
    with caplog.at_level(logging.ERROR):
        await svc.aclose()
    _one_line_error(caplog)
