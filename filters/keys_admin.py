"""``python -m filters.keys_admin``: give, revoke and inspect API keys live in Redis.

    python -m filters.keys_admin --redis-url URL set KEY TENANT [--tier T] [--lane L]
    python -m filters.keys_admin --redis-url URL revoke KEY
    python -m filters.keys_admin --redis-url URL show KEY

Keys are stored hashed (``tw:key:<sha256>``, see :mod:`filters.keys`); filter servers see a
change within their key cache time (1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from filters.keys import key_name, revoke_key, set_key

__all__ = ["main", "run"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m filters.keys_admin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--redis-url", required=True)
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


async def run(redis: Any, ns: argparse.Namespace) -> dict[str, str]:
    if ns.cmd == "set":
        await set_key(redis, ns.key, ns.tenant, ns.tier, ns.lane)
    elif ns.cmd == "revoke":
        await revoke_key(redis, ns.key)
    raw = await redis.hgetall(key_name(ns.key))
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)

    async def go() -> dict[str, str]:
        import redis.asyncio as aioredis

        r = aioredis.Redis.from_url(ns.redis_url)
        try:
            return await run(r, ns)
        finally:
            await r.aclose()

    print(json.dumps(asyncio.run(go())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
