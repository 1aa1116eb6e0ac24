"""The rate-limit service's reload: loaded off the loop by the shared watcher; a hostile edit
keeps the running quotas, the next good edit is applied."""

from __future__ import annotations

from pathlib import Path

from policy import load_policy
from ratelimit_service.server import Service, ServiceSettings

POLICY = "version: 1\ntiers: {{t: {{max_tokens: {n}}}}}\ntenants: {{a: {{tier: t}}}}\n"
BOMB = "version: 1\nplanner:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  l{i}: &l{i} [{', '.join([f'*{p}'] * 10)}]\n"
    for i, p in enumerate(["a"] + [f"l{j}" for j in range(20)])
)


async def test_hostile_edit_keeps_quotas_then_fix_applies(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(n=10))
    svc = Service(ServiceSettings(path), load_policy(path))
    reg = svc.metrics.registry
    path.write_text(BOMB)
    assert not (await svc.watcher.reload()).ok
    assert svc.policy.tiers["t"].max_tokens == 10
    assert reg.get_sample_value("tokenweir_config_reloads_total", {"result": "error"}) == 1
    assert reg.get_sample_value("tokenweir_config_last_reload_error") == 1
    path.write_text(POLICY.format(n=20))
    assert (await svc.watcher.reload()).ok
    assert svc.policy.tiers["t"].max_tokens == 20
    assert reg.get_sample_value("tokenweir_config_last_reload_error") == 0
    await svc.aclose()
