"""The runner's window: the room interactive traffic leaves, bounded by what the gateway says."""

from __future__ import annotations

from batch_service.pacer import Pacer, PoolView


def test_window_is_the_room_interactive_leaves() -> None:
    p = Pacer(max_concurrency=64, fill=0.9, backoff=1.0)
    p.limit = 64
    # 100 slots, 90 may be busy; 30 interactive + our 20 run: 60 more for us, so 60 in all
    assert p.window(PoolView(100, 50, 0.5), ours=20, now=0) == 60
    # interactive rises to 85: only 5 for us
    assert p.window(PoolView(100, 105, 1.0), ours=20, now=0) == 5
    # interactive alone fills the pool: nothing
    assert p.window(PoolView(100, 95, 1.0), ours=0, now=0) == 0
    # no pool state yet, or every replica stale (reported saturated): nothing
    assert p.window(None, ours=0, now=0) == 0
    assert p.window(PoolView(0, 0, 1e9), ours=0, now=0) == 0


def test_a_shed_line_halves_the_limit_and_pauses() -> None:
    p = Pacer(max_concurrency=64, fill=1.0, backoff=2.0)
    p.limit = 40
    idle = PoolView(1000, 0, 0.0)
    assert p.window(idle, 0, now=10.0) == 40
    p.shed(now=10.0)
    assert p.window(idle, 0, now=11.9) == 0  # paused for backoff
    assert p.window(idle, 0, now=12.0) == 20
    p.shed(now=12.0, retry_after=5.0)  # Retry-After longer than the backoff wins
    assert p.window(idle, 0, now=16.9) == 0
    assert p.window(idle, 0, now=17.0) == 10
    for _ in range(100):
        p.answered()
    assert p.window(idle, 0, now=17.0) == 64  # never above max_concurrency
