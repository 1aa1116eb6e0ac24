"""python -m filters.keys_admin against a real Redis, read back by a KeyStore."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio as aioredis

from controlplane.policy import load_policy
from filters.keys import KeyStore, key_name, policy_keys
from filters.keys_admin import main
from tests.filters.conftest import ROOT

pytestmark = pytest.mark.integration


async def test_set_show_revoke_seen_by_a_key_store(
    redis_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    r = aioredis.Redis.from_url(url)
    try:
        store = KeyStore(
            policy_keys(load_policy(ROOT / "examples" / "mesh.yaml")),
            r,
            clock=time.monotonic,
            ttl=0.0,
            negative_ttl=0.0,
        )
        assert await store.lookup("fresh-key-12345") is None
        await _cli(["--redis-url", url, "set", "fresh-key-12345", "demo-pro", "--lane", "batch"])
        shown = json.loads(capsys.readouterr().out)
        assert shown == {"tenant": "demo-pro", "lane": "batch"}
        info = await store.lookup("fresh-key-12345")
        assert info is not None and (info.tenant, info.tier, info.lane) == (
            "demo-pro",
            None,
            "batch",
        )
        await _cli(["--redis-url", url, "revoke", "tw-demo-free-key"])
        assert json.loads(capsys.readouterr().out)["disabled"] == "1"
        assert await store.lookup("tw-demo-free-key") is None  # a policy key, revoked live
    finally:
        await r.delete(key_name("tw-demo-free-key"), key_name("fresh-key-12345"))
        await r.aclose()


async def _cli(argv: list[str]) -> None:
    assert await asyncio.to_thread(main, argv) == 0
