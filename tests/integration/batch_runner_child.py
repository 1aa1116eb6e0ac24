"""A batch runner as its own process, for drills that kill it (``python -m
tests.integration.batch_runner_child REDIS_URL FILES_DIR GATEWAY_URL CONSUMER``): the real
:class:`BatchRunner` against a pool it reads as idle (no control plane in these tests)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from batch_service.files import DirectoryStore
from batch_service.records import Records
from batch_service.runner import BatchRunner, RunnerSettings
from policy.batch import BatchPolicy
from policy.batch import BatchRunner as RunnerPolicy
from poolstate.state import PoolState, PoolSummary
from runtime.redis_connect import connect_redis


class IdlePool:
    """The pool-state reader's one property the runner reads: an idle pool of 100 slots."""

    @property
    def state(self) -> PoolState:
        return PoolState(1, time.time(), {"chat": PoolSummary({}, 100, 0)})


async def main(redis_url: str, files: str, gateway: str, consumer: str, window: int) -> None:
    redis = await connect_redis(redis_url, timeout=2.0)
    policy = BatchPolicy(
        service="batch-api", gateway="edge", pool="chat",
        runner=RunnerPolicy(max_concurrency=window, backoff=0.2, claim_idle=2.0),
    )  # fmt: skip
    runner = BatchRunner(
        RunnerSettings(policy, gateway, consumer),
        Records(redis), DirectoryStore(Path(files)), IdlePool(),  # type: ignore[arg-type]
        clock=time.time, registry=CollectorRegistry(),
    )  # fmt: skip
    await runner.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], a[3], int(a[4]) if len(a) > 4 else 8))
