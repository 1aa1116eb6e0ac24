"""The retry-storm benchmark's figures (bench/storm.py ``summarize``), on hand-made attempts."""

from __future__ import annotations

from overload_client import Attempt
from overload_workload import Arrival
from storm import Setup, summarize

SETUP = Setup(1, 2, 1.0, 64, 0.3, 2, 3.0, 1.0, 4.0, 5.0, 10, 1)  # spike 3..4 s, end 8 s


def arrival(at: float, lane: str = "batch") -> Arrival:
    return Arrival(at, lane, 0, "p", 1, 1)


def served(req: int, number: int, sent: float, lane: str = "batch", tokens: int = 0) -> Attempt:
    a = Attempt(req, lane, number, sent, status=200, first_token=sent + 0.1, ok=True)
    a.token_times = [sent + 0.1 + i * 0.01 for i in range(tokens)]
    return a


def shed(req: int, number: int, sent: float) -> Attempt:
    return Attempt(req, "batch", number, sent, status=503, retry_after=1.0, error="degraded")


def test_attempts_per_success_fresh_batch_and_the_ladder() -> None:
    arrivals = [arrival(1.0, "interactive"), arrival(3.2), arrival(3.4), arrival(5.0),
                arrival(6.0)]  # fmt: skip
    storm = {1, 2}
    attempts = [
        served(0, 1, 1.0, "interactive", tokens=20),
        shed(1, 1, 3.2), shed(1, 2, 4.2), served(1, 3, 5.2, tokens=10),
        shed(2, 1, 3.4), shed(2, 2, 4.4),  # gave up
        shed(3, 1, 5.0), served(3, 2, 6.0, tokens=5),  # fresh, second attempt
        served(4, 1, 6.0, tokens=5),  # fresh, first attempt
    ]  # fmt: skip
    steps = [(0.0, 0.0), (3.25, 1.0), (4.0, 1.0), (5.0, 1.0), (5.5, 0.0), (7.0, 0.0)]
    r = summarize({"attempts": attempts, "steps": steps, "end": 8.0}, arrivals, storm, SETUP)
    assert r["storm"] == {"requests": 2, "served": 1, "gave_up": 1, "attempts": 5,
                          "attempts_per_success": 5.0}  # fmt: skip
    assert r["fresh_batch_after"] == {"requests": 2, "served": 1.0, "served_first_attempt": 0.5}
    assert r["interactive"]["before"]["success"] == 1.0
    assert r["ladder"]["changes"] == 2 and r["ladder"]["changes_at"] == [3.25, 5.5]
    assert r["ladder"]["shed_after_spike_end_s"] == 1.5  # from 4.0 to 5.5
    # 20 tokens streamed in second 1 → pre-spike goodput 10 tok/s (seconds 1 and 2); after the
    # spike the pool streams less than that, so it is not back within 15 s
    assert r["goodput_tok_s"]["before"] == 10.0
    assert r["recovered_s"] is None
