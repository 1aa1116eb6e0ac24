"""`tokenweir up` gives an emulated LoRA pool's replicas SGLang's LoRA flags, which the emulator's
own argument parser reads back as the pool's adapters and slots."""

from __future__ import annotations

from pathlib import Path

from backends.emulator.__main__ import parse_args
from policy.loader import load_policy
from tokenweir.up import Mesh
from tokenweir.up_lora import lora_args

_POLICY = """
version: 1
control_plane: {xds: 127.0.0.1:1, metrics: 127.0.0.1:2}
pools:
  chat:
    models: [m1]
    emulated: {replicas: 2, profile: seed-2k, base_port: 30101}
    lora: {adapters: [sql, legal], slots: 3, paths: {legal: /w/legal-v2}}
  plain:
    models: [m2]
    emulated: {replicas: 1, profile: seed-2k, base_port: 30111}
gateways:
  edge:
    listen: 127.0.0.1:18080
    routes:
      - {name: chat, match: {prefix: /}, pool: chat}
"""


def test_an_emulated_lora_pools_replicas_get_its_adapters_and_slots(tmp_path: Path) -> None:
    config = tmp_path / "mesh.yaml"
    config.write_text(_POLICY)
    policy = load_policy(config)
    mesh = Mesh(config, policy, tmp_path, redis_url=None, delta=False)
    argv = mesh._emulator_argv("chat", 1, policy.pools["chat"].endpoints[1])
    assert argv[1:3] == ["-m", "backends.emulator"]
    lora = parse_args(argv[3:]).lora
    assert lora.enabled and lora.max_loras_per_batch == 3
    assert lora.paths == (("sql", "sql"), ("legal", "/w/legal-v2"))
    plain = mesh._emulator_argv("plain", 0, policy.pools["plain"].endpoints[0])
    assert not parse_args(plain[3:]).lora.enabled
    assert lora_args(policy.pools["plain"]) == []
