"""python -m filters.keys_admin against a real Redis, read back by a KeyStore."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from filters.keys import KeyStore, key_name, policy_keys
from filters.keys_admin import main
from policy import load_policy
from runtime.statedir import MeshInfo, default_state_dir, write_mesh_info
from tests.filters.conftest import ROOT
from tests.helpers import free_port

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


def test_an_unreachable_redis_is_named_with_the_flag_to_change_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert main(["--redis-url", url, "show", "some-key"]) == 1
    err = capsys.readouterr().err
    assert url in err and "(--redis-url)" in err and "Traceback" not in err


def test_the_running_mesh_is_found_through_the_state_dir(
    tmp_path: Path, redis_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    policy = tmp_path / "mesh.yaml"
    policy.write_text((ROOT / "examples" / "mesh.yaml").read_text())
    write_mesh_info(default_state_dir(policy), MeshInfo(os.getpid(), url, str(policy)))
    try:
        assert main(["-c", str(policy), "set", "found-key-123", "demo-pro"]) == 0
        assert json.loads(capsys.readouterr().out) == {"tenant": "demo-pro"}
    finally:
        redis.Redis.from_url(url).delete(key_name("found-key-123"))
