"""Seeding after a reload leaves Redis and the loop to the decisions between its pipelines.

On main a 10k-tenant reload sent 200-script pipelines back to back: Redis ran them while rate-limit
calls (50 ms) and the filter server's key and budget reads waited (813 of 5,372 requests passed
unrated under load in tests/integration/test_reload_under_load.py)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from policy import load_policy_text
from ratelimit_service.directory import seed_defaults, seed_plan

POLICY = "version: 1\ntiers: {std: {quotas: {requests: {burst: 5, refill_per_second: 1}}}}\n" + (
    "tenants:\n" + "".join(f"  t{i}: {{tier: std}}\n" for i in range(10))
)


class _Pipe:
    def __init__(self, log: list[str]) -> None:
        self.log, self.queued = log, 0

    async def execute(self) -> list[int]:
        self.log.append(f"pipeline of {self.queued}")
        return [0] * self.queued


class _Client:
    """Just enough of redis.asyncio.Redis for seed_defaults (its pipelines never wait)."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def register_script(self, _source: str) -> Any:
        async def script(*, keys: list[str], args: list[str], client: _Pipe) -> None:
            client.queued += 1

        return script

    def pipeline(self, transaction: bool = False) -> _Pipe:
        return _Pipe(self.log)


async def _interleaving(rest: float) -> list[str]:
    client = _Client()
    policy = load_policy_text(POLICY)
    done = False

    async def decisions() -> None:
        while not done:
            client.log.append("decision")
            await asyncio.sleep(0)

    other = asyncio.create_task(decisions())
    await asyncio.sleep(0)
    await seed_defaults(client, policy, plan=seed_plan(policy), batch=4, rest=rest)
    done = True
    await other
    return client.log


async def test_with_rest_the_loop_runs_between_pipelines() -> None:
    log = await _interleaving(rest=1.0)
    pipelines = [i for i, e in enumerate(log) if e.startswith("pipeline")]
    assert [log[i] for i in pipelines] == ["pipeline of 4", "pipeline of 4", "pipeline of 2"]
    assert all("decision" in log[a:b] for a, b in itertools.pairwise(pipelines))


async def test_without_rest_pipelines_go_back_to_back() -> None:
    log = await _interleaving(rest=0.0)
    pipelines = [i for i, e in enumerate(log) if e.startswith("pipeline")]
    assert pipelines == list(range(pipelines[0], pipelines[0] + 3))
