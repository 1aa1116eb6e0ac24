"""The runner's window: the room interactive traffic leaves, bounded by what the gateway says."""

from __future__ import annotations

from batch_service.pacer import Pacer, PoolView


def test_window_is_a_share_of_the_room_interactive_leaves() -> None:
    p = Pacer(max_concurrency=128, fill=0.9, backoff=1.0)
    # 100 slots; 30 interactive + our 20 run: the room is 70, 90% of it is 63 lines in all
    assert p.window(PoolView(100, 50, 0.5, version=1), ours=20, now=0) == 63
    # interactive alone fills the pool: nothing
    assert p.window(PoolView(100, 100, 1.0, version=2), ours=0, now=1) == 0
    # what waits in the replicas' queue is demand too (ours excluded)
    q = Pacer(max_concurrency=128, fill=1.0, backoff=1.0, trend=0.0)
    assert q.window(PoolView(100, 80, 1.0, queued=10, version=1), ours=20, now=0) == 29
    # no pool state yet, or every replica stale (reported saturated): nothing
    assert p.window(None, ours=0, now=2) == 0
    assert p.window(PoolView(0, 0, 1e9), ours=0, now=2) == 0


def test_a_sample_taken_before_our_lines_finished_does_not_count_them_as_interactive() -> None:
    """The pool state is up to ``lag`` old: lines of ours that finished since are still in it.
    Counting them as interactive work left their slots idle at every turnover."""
    p = Pacer(max_concurrency=128, fill=1.0, backoff=1.0, lag=0.5, trend=0.0)
    assert p.window(PoolView(64, 60, 0.9, version=1), ours=60, now=0.0) == 63  # one slot held free
    # 20 of ours finish at 0.1 s; the sample still shows them running (60): the room is 64
    assert p.window(PoolView(64, 60, 0.9, version=1), ours=40, now=0.1) == 63
    # once the lag has passed, 60 running with 40 of ours are 20 others: the room is 44
    assert p.window(PoolView(64, 60, 0.9, version=1), ours=40, now=0.7) == 43


def test_interactive_demand_rising_is_held_free_before_it_queues() -> None:
    p = Pacer(max_concurrency=128, fill=1.0, backoff=1.0, lag=0.0, trend=2.0)
    # steady interactive demand (4): one slot held free
    assert p.window(PoolView(64, 4, 0.1, version=1), ours=0, now=0.0) == 59
    assert p.window(PoolView(64, 54, 0.9, version=2), ours=50, now=0.25) == 59
    # a burst: interactive 4 -> 12 in one sample; that rise (8) is held free as well
    assert p.window(PoolView(64, 62, 1.0, version=3), ours=50, now=0.5) == 64 - 12 - 8
    # the same sample read again does not count as a second point of the trend
    assert p.window(PoolView(64, 62, 1.0, version=3), ours=50, now=0.55) == 44
    # the burst is over 2 s later: only the one slot again
    assert p.window(PoolView(64, 62, 1.0, version=4), ours=50, now=2.6) == 64 - 12 - 1


def test_a_shed_line_halves_the_limit_and_pauses() -> None:
    p = Pacer(max_concurrency=64, fill=1.0, backoff=2.0)
    idle = PoolView(1000, 0, 0.0)
    assert p.window(idle, 0, now=10.0) == 64  # no slow start: the pool state bounds the window
    p.shed(now=10.0)
    assert p.window(idle, 0, now=11.9) == 0  # paused for backoff
    assert p.window(idle, 0, now=12.0) == 32
    p.shed(now=12.0, retry_after=5.0)  # Retry-After longer than the backoff wins
    assert p.window(idle, 0, now=16.9) == 0
    assert p.window(idle, 0, now=17.0) == 16
    for _ in range(100):
        p.answered()
    assert p.window(idle, 0, now=17.0) == 64  # never above max_concurrency
