"""``tokenweir keys`` (``python -m filters.keys_admin``): give, revoke and inspect API keys live.

    tokenweir keys [-c POLICY] [--state-dir DIR] [--redis-url URL] set KEY TENANT [--tier T] [--lane L]
    tokenweir keys [-c POLICY] revoke KEY
    tokenweir keys [-c POLICY] show KEY

The Redis is found by itself (``runtime.statedir.find_redis``): ``--redis-url``, else the running
``tokenweir up`` of the policy's state directory, else the policy's ``ratelimit.redis_url``.
Keys are stored hashed (``tw:key:<sha256>``, see :mod:`filters.keys`); filter servers see a
change within their key cache time (1 s). A revocation is a tombstone: it also refuses a key the
policy file lists, and survives a restart of ``tokenweir up`` (its Redis keeps an append-only file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from filters.keys import key_name, revoke_key, set_key
from policy import PolicyError, load_policy
from runtime.redis_connect import redacted
from runtime.statedir import RedisTarget, default_state_dir, find_redis, unreachable

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["main", "run", "target"]

_DEFAULT_POLICY = Path("examples/mesh.yaml")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tokenweir keys", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("-c", "--config", type=Path, help="policy (default: examples/mesh.yaml)")
    p.add_argument("--state-dir", type=Path, help="of `tokenweir up` (default: next to the policy)")
    p.add_argument("--redis-url", help="default: the running mesh's, else the policy's")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("set", help="give KEY to TENANT")
    s.add_argument("key")
    s.add_argument("tenant")
    s.add_argument("--tier")
    s.add_argument("--lane", choices=["interactive", "batch"])
    sub.add_parser("revoke", help="disable KEY (even one the policy file lists)").add_argument(
        "key"
    )
    sub.add_parser("show", help="what Redis holds for KEY").add_argument("key")
    return p


async def run(redis: Redis, ns: argparse.Namespace) -> dict[str, str]:
    if ns.cmd == "set":
        await set_key(redis, ns.key, ns.tenant, ns.tier, ns.lane)
    elif ns.cmd == "revoke":
        await revoke_key(redis, ns.key)
    raw = await redis.hgetall(key_name(ns.key))
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }


def target(ns: argparse.Namespace) -> RedisTarget:
    """Which Redis to use; raises PolicyError for a policy that does not load."""
    if ns.redis_url:
        return find_redis(ns.redis_url, None, None)
    config = ns.config or _DEFAULT_POLICY
    policy_url = None
    if ns.config is not None or config.exists():  # a policy named explicitly must load
        rl = load_policy(config).ratelimit
        policy_url = rl.redis_url if rl is not None else None
    state = ns.state_dir or default_state_dir(config)
    return find_redis(None, state, policy_url)


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        where = target(ns)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2

    async def go() -> dict[str, str]:
        import redis.asyncio as aioredis

        r = aioredis.Redis.from_url(where.url, socket_connect_timeout=2)
        try:
            return await run(r, ns)
        finally:
            await r.aclose()

    try:
        print(json.dumps(asyncio.run(go())))
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        print(unreachable(where, exc), file=sys.stderr)
        return 1
    except RedisError as exc:
        print(f"redis at {redacted(where.url)}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
