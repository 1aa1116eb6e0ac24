"""The options every admin CLI that talks to the running mesh's Redis shares (``tokenweir
quota``, ``tokenweir shadow``): the policy, ``--redis-url`` and the state directory of
``tokenweir up`` (runtime/statedir.py's ``find_redis`` reads them in that order)."""

from __future__ import annotations

import argparse
from pathlib import Path

import redis

from runtime.statedir import RedisTarget, unreachable

__all__ = ["REDIS_FAILURES", "add_mesh_redis_args", "redis_failure"]

REDIS_FAILURES = (redis.RedisError, OSError)  # what an admin CLI's Redis call may raise
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def redis_failure(target: RedisTarget, exc: BaseException) -> str:
    """The one line an admin CLI prints for a failed Redis call: where it looked and what to
    change when Redis cannot be reached, the URL and Redis's own error otherwise."""
    if isinstance(exc, _UNREACHABLE):
        return unreachable(target, exc)
    return f"redis at {target.url}: {exc}"


def add_mesh_redis_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c", "--config", type=Path, default=Path("examples/mesh.yaml"), help="policy"
    )
    parser.add_argument(
        "--redis-url", default=None, help="default: the running mesh's, else the policy's"
    )
    parser.add_argument(
        "--state-dir", type=Path, help="of `tokenweir up` (default: next to the policy)"
    )
