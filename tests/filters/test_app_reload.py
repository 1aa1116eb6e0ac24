"""The filter server's reload: built off the loop by the shared watcher; bad edits keep the
running chains, and the next good edit is applied."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from filters.app import FilterApp, Settings

POLICY = """version: 1
filters: {{address: 127.0.0.1:18082}}
pools: {{chat: {{models: [m], endpoints: [127.0.0.1:9]}}}}
gateways:
  edge:
    listen: 127.0.0.1:10000
    routes:
      - {{name: chat, match: {{prefix: /}}, pool: chat, filters: {{plugins: [{plugins}]}}}}
"""
DEEP = "version: 1\nplanner: " + "[" * 800 + "]" * 800 + "\n"


def _errors(app: FilterApp) -> float:
    reg = app.metrics.registry
    return reg.get_sample_value("tokenweir_config_reloads_total", {"result": "error"}) or 0.0


@pytest.mark.parametrize(
    "bad",
    [
        DEEP,
        POLICY.format(plugins="{name: usage, settings: {bogus: 1}}"),
        POLICY.format(plugins="nope"),
    ],
    ids=["deep", "bad-usage-setting", "unknown-plugin"],
)
async def test_bad_edit_keeps_chains_then_fix_applies(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "mesh.yaml"
    path.write_text(POLICY.format(plugins="identity"))
    app = FilterApp(Settings(path), clock=time.monotonic)
    first = app.policy
    path.write_text(bad)
    outcome = await app.reload()
    assert not outcome.ok and app.policy is first
    assert _errors(app) == 1
    assert app.metrics.registry.get_sample_value("tokenweir_config_last_reload_error") == 1
    path.write_text(POLICY.format(plugins="identity, usage"))
    assert (await app.reload()).ok
    plugins = app.policy.gateways["edge"].routes[0].filters.plugins  # type: ignore[union-attr]
    assert [p.name for p in plugins] == ["identity", "usage"]
    assert app.metrics.registry.get_sample_value("tokenweir_config_last_reload_error") == 0
    await app.aclose()
