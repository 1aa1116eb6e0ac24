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


def test_a_sample_taken_before_our_lines_finished_does_not_read_them_as_interactive() -> None:
    """The pool state is up to ``lag`` old: lines of ours that finished since are still in it.
    Read as interactive work, they looked like a burst and shrank the window at every
    turnover."""
    p = Pacer(max_concurrency=128, fill=1.0, backoff=1.0, lag=0.5)
    assert p.window(PoolView(64, 60, 0.9, version=1), ours=60, now=0.0) == 63  # 1 slot kept
    # 20 of ours finish at 0.1 s; a sample at 0.2 s still shows them running: no burst
    assert p.window(PoolView(64, 60, 0.9, version=1), ours=40, now=0.1) == 63
    assert p.window(PoolView(64, 60, 0.9, version=2), ours=40, now=0.2) == 63
    assert p.headroom() == 1


def plant(
    p: Pacer,
    interactive: list[int],
    transit: int,
    pending: int = 10**6,
    admitted: int = 10**6,
) -> list[int]:
    """The pacer against a replica of 64 slots sampled every 0.25 s, one sample late: the
    replica runs the interactive requests and those of our lines not in the gateway
    (``transit`` of them are, and the gateway's admission lets at most ``admitted`` through);
    the runner keeps the window full while it has lines."""
    windows, ours, seen = [], 0, 0
    for i, inter in enumerate(interactive):
        at_replica = inter + min(admitted, max(0, seen - transit))
        w = p.window(
            PoolView(64, min(64, at_replica), 0.5, max(0, at_replica - 64), i), ours, i / 4
        )
        seen, ours = ours, min(w, pending)
        windows.append(w)
    return windows


def test_the_window_closes_the_loop_on_the_replicas_occupancy() -> None:
    """Lines in the gateway (its filters, admission, recording results) hold no slot: a window
    counted in lines in flight left their share of the slots idle. The window grows until the
    replica's own count reaches the capacity less what is kept free."""
    p = Pacer(max_concurrency=128, fill=0.95, backoff=1.0)
    w = plant(p, [4] * 60, transit=10)
    # 64 slots, 4 interactive, 4 kept free (5% of the room): 56 of ours in slots, 10 in transit
    assert 64 <= w[-1] <= 67
    assert w[-1] - 10 >= 0.9 * (64 - 4)
    assert max(w) <= 72  # no wild overshoot on the way


def test_the_window_aims_no_higher_than_admission_lets_the_batch_lane_hold() -> None:
    """Admission holds the batch lane to ``max_share`` of the slots (57 of 64 at 0.9). With one
    interactive request the occupancy aimed at (60) was out of reach: the window grew to its
    maximum, and the lines past admission's share waited in the gateway's queue (which the
    degradation ladder reads as the pool's overload)."""
    unbounded = plant(Pacer(128, 0.95, 1.0), [1] * 120, transit=10, admitted=57)
    assert unbounded[-1] >= 120  # wound up toward its maximum (what the bound prevents)
    bounded = plant(Pacer(128, 0.95, 1.0, lane_share=0.9), [1] * 120, transit=10, admitted=57)
    assert max(bounded) <= 57 + 10 + 4  # admission's share, our lines in transit, one step
    assert bounded[-1] - 10 >= 0.95 * 57  # and the share it allows is used


def test_an_interactive_burst_shrinks_the_window_within_a_few_samples() -> None:
    p = Pacer(max_concurrency=128, fill=0.95, backoff=1.0)
    w = plant(p, [4] * 40 + [24] * 20, transit=10)
    before = w[39]
    assert w[41] <= before - 20  # the rise itself is kept free at once
    assert all(x <= before - 15 for x in w[41:])
    # settled: interactive 24 and what is kept free leave 36 slots; ours fill them again
    assert w[-1] - 10 >= 0.85 * (64 - 24)


def test_the_window_does_not_wind_up_while_the_runner_has_few_lines() -> None:
    p = Pacer(max_concurrency=128, fill=0.95, backoff=1.0)
    w = plant(p, [4] * 40, transit=0, pending=5)  # 5 lines left: the window never binds
    assert w[-1] <= w[0]


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


def test_new_lines_start_in_small_bursts() -> None:
    """A whole window opened at once sent it into the filter server together."""
    p = Pacer(max_concurrency=128, fill=1.0, backoff=1.0)
    assert p.starts(now=100.0, want=60) == 16  # an eighth of max_concurrency at once
    assert p.starts(now=100.0, want=60) == 0
    assert p.starts(now=100.05, want=60) == 6  # then 128 a second
    assert p.starts(now=101.0, want=3) == 3
    assert p.starts(now=101.0, want=60) == 13  # the bucket holds no more than a burst
    small = Pacer(max_concurrency=2, fill=1.0, backoff=1.0)  # at least 4, 32 a second
    assert small.starts(now=5.0, want=10) == 4
    assert small.starts(now=5.25, want=10) == 4
