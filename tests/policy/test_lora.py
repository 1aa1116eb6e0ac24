"""A pool's LoRA adapters are models of the pool: routes, quotas and prices take their names."""

from __future__ import annotations

from policy.loader import load_policy_text

POLICY = """
version: 1
pools:
  chat:
    models: [m1]
    lora: {adapters: [sql, support], slots: 4}
tiers:
  free:
    quotas:
      models: {sql: {burst: 1000, refill_per_second: 10}}
prices:
  sql: {prompt: 0.001, completion: 0.002}
  m1: {prompt: 0.0002, completion: 0.0006}
"""


def test_adapters_become_models_with_quotas_and_prices() -> None:
    policy = load_policy_text(POLICY)
    pool = policy.pools["chat"]
    assert pool.models == ("m1", "sql", "support")  # the base model stays first
    assert pool.lora is not None and pool.lora.slots == 4
    assert "sql" in policy.tiers["free"].quotas.models
