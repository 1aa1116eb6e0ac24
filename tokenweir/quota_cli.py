"""``tokenweir quota get|set|list|reset``: live quota administration in Redis (docs/quotas.md).

The same keys an operator can edit with plain ``redis-cli`` (``HSET tw:{TENANT}:quota FIELD
VALUE``); the rate-limit service picks any change up within one second. The Redis is found by
itself (``runtime.statedir.find_redis``): ``--redis-url``, else the running ``tokenweir up`` of
the policy's state directory, else the policy's ``ratelimit.redis_url``; a connection error
names the URL tried and the flag that changes it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TypeAlias, TypedDict

import redis
from redis.cluster import RedisCluster

from policy import Policy, PolicyError, load_policy
from quota.config import (
    all_limits,
    effective_quotas,
    limits_for_tenant,
    parse_quota_fields,
    tenant_defaults,
)
from quota.keys import bucket_key, config_key, seed_key, window_key
from quota.reader import decode_map, limit_remaining
from quota.windows import window
from ratelimit_service.store import load_script
from runtime.redis_connect import split_cluster_flag
from runtime.statedir import RedisTarget, default_state_dir, find_redis
from tokenweir.admin_args import REDIS_FAILURES, add_mesh_redis_args, redis_failure

__all__ = ["register"]

Client: TypeAlias = "redis.Redis | RedisCluster"
Action: TypeAlias = Callable[[argparse.Namespace, Policy, Client], int]


class FieldInfo(TypedDict):
    value: str | None
    source: str  # "policy" or "live edit"


class LimitInfo(TypedDict):
    quota: str  # QUOTA.UNIT
    limit: int
    rate: float
    remaining: int
    shadow: bool


class TenantInfo(TypedDict):
    """What ``quota get`` prints (``--json``: this object as it is)."""

    tenant: str
    known: bool
    fields: dict[str, FieldInfo]
    limits: list[LimitInfo]
    problems: list[str]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    q = subparsers.add_parser("quota", help="show and edit tenant quotas live in Redis")
    add_mesh_redis_args(q)
    q.add_argument("--json", action="store_true", help="machine-readable output")
    qs = q.add_subparsers(metavar="ACTION", required=True)
    g = qs.add_parser("get", help="effective quotas of a tenant and what each still admits")
    g.add_argument("tenant")
    g.add_argument("--model")
    g.add_argument("--lane")
    g.set_defaults(func=_get)
    s = qs.add_parser("set", help="set live fields: tokens.burst=5000 tokens.per_month=none ...")
    s.add_argument("tenant")
    s.add_argument("fields", nargs="+", metavar="FIELD=VALUE")
    s.set_defaults(func=_set)
    ls = qs.add_parser("list", help="every tenant (policy and live) with its quotas")
    ls.set_defaults(func=_list)
    r = qs.add_parser("reset", help="refill/clear a tenant's counters and/or drop its live edits")
    r.add_argument("tenant")
    r.add_argument("--usage", action="store_true", help="refill buckets, zero windows (default)")
    r.add_argument("--edits", action="store_true", help="restore the policy's defaults")
    r.set_defaults(func=_reset)


def _target(args: argparse.Namespace, policy: Policy) -> RedisTarget:
    state = args.state_dir or default_state_dir(args.config)
    policy_url = policy.ratelimit.redis_url if policy.ratelimit else None
    return find_redis(args.redis_url, state, policy_url)


def _connect(policy: Policy, target: RedisTarget) -> Client:
    url, cluster = split_cluster_flag(target.url)  # rediss:// keeps its ssl_* arguments
    if cluster:
        return RedisCluster.from_url(url)
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    if int(client.info("cluster").get("cluster_enabled", 0)):
        client.close()
        return RedisCluster.from_url(url)
    return client


def _run(args: argparse.Namespace, action: Action) -> int:
    try:
        policy = load_policy(args.config)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    target = _target(args, policy)
    try:
        client = _connect(policy, target)
    except REDIS_FAILURES as exc:
        print(redis_failure(target, exc), file=sys.stderr)
        return 1
    try:
        return int(action(args, policy, client))
    except REDIS_FAILURES as exc:
        print(redis_failure(target, exc), file=sys.stderr)
        return 1
    finally:
        client.close()


def _describe(
    policy: Policy, client: Client, tenant: str, model: str | None, lane: str | None
) -> TenantInfo:
    defaults = tenant_defaults(policy, tenant)
    live = decode_map(client.hgetall(config_key(tenant)))
    seeded = decode_map(client.hgetall(seed_key(tenant)))
    sq = effective_quotas(defaults, live)
    now_us = int(time.time() * 1_000_000)
    fields: dict[str, FieldInfo] = {}
    for name in sorted({*(defaults or {}), *live}):
        edited = name in live and live[name] != seeded.get(name, (defaults or {}).get(name))
        value = live.get(name, (defaults or {}).get(name))
        fields[name] = {"value": value, "source": "live edit" if edited else "policy"}
    limits: list[LimitInfo] = []
    chosen = limits_for_tenant(sq, model, lane) if model or lane else all_limits(sq)
    for lim in chosen:
        raw: list[bytes | str | None] | bytes | str | None  # HMGET tk ts, or GET of a window
        if lim.unit == "bucket":
            raw = client.hmget(bucket_key(tenant, lim.quota), "tk", "ts")
        else:
            raw = client.get(window_key(tenant, lim.quota, lim.unit, window(lim.unit, now_us)[0]))
        limits.append(
            {
                "quota": f"{lim.quota}.{lim.unit}",
                "limit": lim.limit,
                "rate": lim.rate,
                "remaining": limit_remaining(lim, raw, now_us),
                "shadow": lim.shadow,
            }
        )
    return {
        "tenant": tenant,
        "known": sq.known,
        "fields": fields,
        "limits": limits,
        "problems": list(sq.problems),
    }


def _print(args: argparse.Namespace, info: TenantInfo) -> None:
    if args.json:
        print(json.dumps(info, indent=2))
        return
    print(
        f"tenant {info['tenant']}"
        + ("" if info["known"] else "  (unknown: no policy entry, no live fields)")
    )
    for name, f in info["fields"].items():
        print(f"  {name:<40} {f['value']:<14} {f['source']}")
    for lim in info["limits"]:
        extra = " (shadow)" if lim["shadow"] else ""
        print(f"  {lim['quota']:<40} remaining {lim['remaining']} of {lim['limit']}{extra}")
    for p in info["problems"]:
        print(f"  ! {p}")


def _get(args: argparse.Namespace) -> int:
    def act(args: argparse.Namespace, policy: Policy, client: Client) -> int:
        _print(args, _describe(policy, client, args.tenant, args.model, args.lane))
        return 0

    return _run(args, act)


def _set(args: argparse.Namespace) -> int:
    pairs = {}
    for item in args.fields:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"expected FIELD=VALUE, got {item!r}", file=sys.stderr)
            return 2
        pairs[name.strip()] = value.strip()
    _, problems = parse_quota_fields(pairs)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2

    def act(args: argparse.Namespace, policy: Policy, client: Client) -> int:
        client.hset(config_key(args.tenant), mapping=pairs)
        _print(args, _describe(policy, client, args.tenant, None, None))
        return 0

    return _run(args, act)


def _list(args: argparse.Namespace) -> int:
    def act(args: argparse.Namespace, policy: Policy, client: Client) -> int:
        tenants = set(policy.tenants)
        for key in client.scan_iter(match="tw:{*}:quota", count=1000):
            name = (key.decode() if isinstance(key, bytes) else key)[4:-7]
            if not name.startswith("svc:"):
                tenants.add(name)
        infos = [_describe(policy, client, t, None, None) for t in sorted(tenants)]
        if args.json:
            print(json.dumps(infos, indent=2))
        else:
            for info in infos:
                _print(args, info)
        return 0

    return _run(args, act)


def _reset(args: argparse.Namespace) -> int:
    def act(args: argparse.Namespace, policy: Policy, client: Client) -> int:
        t = args.tenant
        if args.edits:
            client.delete(config_key(t), seed_key(t))
            fields = tenant_defaults(policy, t) or {}
            args_ = [x for kv in sorted(fields.items()) for x in kv]
            client.register_script(load_script("seed"))(
                keys=[config_key(t), seed_key(t)], args=args_
            )
        if args.usage or not args.edits:
            now_us = int(time.time() * 1_000_000)
            sq = effective_quotas(
                tenant_defaults(policy, t), decode_map(client.hgetall(config_key(t)))
            )
            keys = set()
            for quota in sq.quotas:
                keys.add(bucket_key(t, quota))
                for unit in ("minute", "hour", "day", "month"):
                    keys.add(window_key(t, quota, unit, window(unit, now_us)[0]))
            for key in sorted(keys):
                client.delete(key)
        _print(args, _describe(policy, client, t, None, None))
        return 0

    return _run(args, act)
