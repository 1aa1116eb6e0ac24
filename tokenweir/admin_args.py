"""What the subcommands share: the policy read or its problems printed (:func:`load_or_report`),
and the options every admin CLI that talks to the running mesh's Redis has (``tokenweir
quota``, ``tokenweir shadow``): the policy, ``--redis-url`` and the state directory of
``tokenweir up`` (runtime/statedir.py's ``find_redis`` reads them in that order).

Its own module so that the subcommands' modules import it, not :mod:`tokenweir.cli`, which
registers them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import redis

from policy import Policy, PolicyError, load_policy
from runtime.redis_connect import redacted
from runtime.statedir import RedisTarget, unreachable

__all__ = ["REDIS_FAILURES", "add_mesh_redis_args", "load_or_report", "redis_failure"]

REDIS_FAILURES = (redis.RedisError, OSError)  # what an admin CLI's Redis call may raise
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def load_or_report(path: Path) -> Policy | None:
    """The policy at ``path``, or None after printing every problem to stderr."""
    try:
        return load_policy(path)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return None


def redis_failure(target: RedisTarget, exc: BaseException) -> str:
    """The one line an admin CLI prints for a failed Redis call: where it looked and what to
    change when Redis cannot be reached, the URL and Redis's own error otherwise."""
    if isinstance(exc, _UNREACHABLE):
        return unreachable(target, exc)
    return f"redis at {redacted(target.url)}: {exc}"


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
