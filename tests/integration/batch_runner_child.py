"""A batch runner as its own process, for drills that kill it (``python -m
tests.integration.batch_runner_child REDIS_URL FILES_DIR GATEWAY_URL CONSUMER``): the real
:class:`BatchRunner` against a pool it reads as idle (no control plane in these tests)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from batch_service.files import DirectoryStore
from batch_service.records import Records
from runtime.redis_connect import connect_redis
from tests.integration.batch_jobs import batch_runner, runner_policy


async def main(redis_url: str, files: str, gateway: str, consumer: str, window: int) -> None:
    redis = await connect_redis(redis_url, timeout=2.0)
    policy = runner_policy(max_concurrency=window, backoff=0.2, claim_idle=2.0)
    await batch_runner(policy, gateway, consumer, Records(redis), DirectoryStore(Path(files))).run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], a[3], int(a[4]) if len(a) > 4 else 8))
