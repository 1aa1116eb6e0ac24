"""``tokenweir quota``: live edits in Redis, seen by the service; seeding never overwrites them."""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import pytest
import redis

from policy import load_policy
from quota.keys import bucket_key, config_key
from ratelimit_service.directory import seed_defaults
from tokenweir.quota_cli import register


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    register(sub)
    args = p.parse_args(argv)
    return int(args.func(args))


@pytest.fixture
def setup(tmp_path: Path, redis_port: int) -> tuple[list[str], str, redis.Redis]:
    tenant = "q" + uuid.uuid4().hex[:8]
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\n"
        "tiers: {free: {quotas: {tokens: {burst: 2000, refill_per_second: 20, per_day: 9000}}}}\n"
        f"tenants: {{{tenant}: {{tier: free}}}}\n"
    )
    base = [
        "quota",
        "-c",
        str(policy),
        "--redis-url",
        f"redis://127.0.0.1:{redis_port}/0",
        "--json",
    ]
    client = redis.Redis(port=redis_port)
    return base, tenant, client


def _get(base: list[str], tenant: str, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert run([*base, "get", tenant]) == 0
    return json.loads(capsys.readouterr().out)


async def test_set_get_reset(
    setup: tuple[list[str], str, redis.Redis], capsys: pytest.CaptureFixture[str]
) -> None:
    base, tenant, client = setup
    policy = load_policy(base[2])
    await _seed(client, policy)
    info = _get(base, tenant, capsys)
    assert info["fields"]["tokens.burst"] == {"value": "2000", "source": "policy"}
    assert run([*base, "set", tenant, "tokens.burst=5000", "tokens.per_day=none"]) == 0
    assert client.hget(config_key(tenant), "tokens.burst") == b"5000"
    info = _get(base, tenant, capsys)
    assert info["fields"]["tokens.burst"] == {"value": "5000", "source": "live edit"}
    assert [x["quota"] for x in info["limits"]] == ["tokens.bucket"]  # per_day switched off
    # restarting the service (seeding again) keeps the live edit
    await _seed(client, policy)
    assert client.hget(config_key(tenant), "tokens.burst") == b"5000"
    client.hset(bucket_key(tenant, "tokens"), mapping={"tk": "10", "ts": "1"})
    assert run([*base, "reset", tenant]) == 0  # usage: the bucket is full again
    assert client.exists(bucket_key(tenant, "tokens")) == 0
    assert run([*base, "reset", tenant, "--edits"]) == 0
    info = _get(base, tenant, capsys)
    assert info["fields"]["tokens.burst"] == {"value": "2000", "source": "policy"}
    assert info["fields"]["tokens.per_day"]["value"] == "9000"


def test_bad_fields_are_refused(setup: tuple[list[str], str, redis.Redis]) -> None:
    base, tenant, client = setup
    assert run([*base, "set", tenant, "tokens.bursty=5"]) == 2
    assert run([*base, "set", tenant, "tokens.burst=-4"]) == 2
    assert run([*base, "set", tenant, "tokens.burst"]) == 2
    assert client.exists(config_key(tenant)) == 0


def test_list_includes_live_only_tenants(
    setup: tuple[list[str], str, redis.Redis], capsys: pytest.CaptureFixture[str]
) -> None:
    base, tenant, client = setup
    client.hset(config_key(f"{tenant}-live"), "tokens.per_hour", "100")
    capsys.readouterr()
    assert run([*base, "list"]) == 0
    names = {i["tenant"]: i for i in json.loads(capsys.readouterr().out)}
    assert tenant in names and names[f"{tenant}-live"]["limits"][0]["quota"] == "tokens.hour"


async def _seed(client: redis.Redis, policy: object) -> None:
    import redis.asyncio as aioredis

    port = client.connection_pool.connection_kwargs["port"]
    a = aioredis.Redis(port=port)
    try:
        await seed_defaults(a, policy)  # type: ignore[arg-type]
    finally:
        await a.aclose()


async def test_new_policy_defaults_propagate_but_live_edits_stay(
    setup: tuple[list[str], str, redis.Redis], tmp_path: Path
) -> None:
    base, tenant, client = setup
    await _seed(client, load_policy(base[2]))
    client.hset(config_key(tenant), "tokens.per_day", "123")  # an operator's edit
    changed = tmp_path / "changed.yaml"
    changed.write_text(
        Path(base[2])
        .read_text()
        .replace("burst: 2000", "burst: 3000")
        .replace("per_day: 9000", "per_day: 8000")
    )
    await _seed(client, load_policy(changed))
    fields = {k.decode(): v.decode() for k, v in client.hgetall(config_key(tenant)).items()}
    assert fields["tokens.burst"] == "3000"  # untouched default follows the policy
    assert fields["tokens.per_day"] == "123"  # the live edit wins
