"""Retry storms (issue 10 item 6), behaviour not timing: a burst far above the pool's capacity
behind tokenweir's admission (real `tokenweir up`, real emulators). Clients that honour
Retry-After get in within a bounded number of attempts per successful request; clients that
retry at once, on the same gateway with the same burst, make many more."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

from overload import drive, wait_idle  # noqa: E402
from overload_arms import EmulatorPool, PoolSpec  # noqa: E402
from overload_client import Behaviour  # noqa: E402
from overload_stats import summarize  # noqa: E402
from overload_tokenweir import Tokenweir  # noqa: E402
from overload_workload import Phase, load_sample, schedule  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(300)]


async def test_retry_after_honouring_clients_need_few_attempts_per_success(tmp_path: Path) -> None:
    spec = PoolSpec(replicas=1, running=2, profile="llama-3.1-8b-h100", time_scale=1.0,
                    capacity_rps=20.0, queue_wait_s=2.0)  # fmt: skip
    pool = EmulatorPool(spec, tmp_path)
    arm = Tokenweir(pool, tmp_path)
    # a short batch queue, so that most of the burst is shed at once (with Retry-After)
    arm.overrides = {"admission": {"batch": {"max_wait": "300ms", "max_queue": 8}}}
    await pool.start("storm")
    try:
        await arm.start()
        # 60 requests within 0.2 s: the pool runs 2 at a time
        burst = schedule(
            load_sample(), [Phase(0.2, 1.0)], capacity_rps=300.0, interactive_share=0.0,
            tenants_per_lane=4, length_scale=64, rng=random.Random(5),
        )  # fmt: skip
        assert len(burst) >= 40
        patience = {"interactive": 60.0, "batch": 60.0}
        runs = {}
        untold: list[tuple[object, object]] = []  # honouring clients' rejections without one
        for b in (Behaviour("honour", max_attempts=30), Behaviour("immediate", max_attempts=30)):
            assert await wait_idle(arm)
            got = await drive(arm, burst, b, patience, seed=5, sample_every=0.5)
            runs[b.name] = summarize(got["attempts"], window=(0.0, got["end"]))["all"]
            if b.name == "honour":
                untold = [
                    (a.status, a.error)
                    for a in got["attempts"]
                    if a.rejected and a.retry_after is None
                ]
    finally:
        await arm.aclose()
    honour, immediate = runs["honour"], runs["immediate"]
    assert honour["rejections"] > 0, honour  # the burst was shed: a storm could start
    # every client was told (the message names the answers that came without a Retry-After)
    assert honour["rejections_with_retry_after"] == 1.0, (untold, honour)
    assert honour["success_rate"] >= 0.95, honour  # and waiting as told got them in
    # bounded: rounds of waiting as told, well below the 30 attempts a client may make (every
    # shed client is told about the same wait, so they come back together: several rounds)
    assert honour["attempts_per_success"] <= 15.0, honour
    # the same burst with clients that retry at once: they burn through their attempts
    assert immediate["attempts_per_success"] > honour["attempts_per_success"] + 5, immediate
