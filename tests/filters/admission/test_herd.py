"""Promised return times (``Retry-After``): spreading, claiming, expiry, the return share."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.plugins.admission.herd import Promises, window


def test_a_client_back_when_told_claims_its_place_once() -> None:
    p = Promises()
    p.add(10.0, 2.0, "a")
    assert p.outstanding(9.0) == 1
    assert p.claim(10.2, "a")
    assert not p.claim(10.3, "a")  # kept already
    assert p.due(10.3, 99.0) == 0 and p.claimed == 1 and p.expired == 0


def test_a_client_early_is_fresh_and_keeps_its_promise_for_later() -> None:
    p = Promises()
    p.add(10.0, 4.0, "a")
    earliest, _ = window(10.0, 4.0)
    assert not p.claim(earliest - 0.01, "a")
    assert p.claim(earliest + 0.01, "a")


def test_another_key_cannot_claim() -> None:
    p = Promises()
    p.add(10.0, 1.0, ("tenant-a", "120", ""))
    assert not p.claim(10.0, ("tenant-b", "120", ""))
    assert not p.claim(10.0, ("tenant-a", "121", ""))
    assert p.claim(10.0, ("tenant-a", "120", ""))


def test_a_client_that_never_comes_back_expires_and_lowers_the_return_share() -> None:
    p = Promises()
    _, latest = window(10.0, 6.0)
    assert latest == pytest.approx(11.8)  # 30% of the told wait late, at least a second
    p.add(10.0, 6.0, "a")
    assert p.outstanding(9.99) == 1 and p.outstanding(10.01) == 0  # late: no longer ahead
    assert p.due(latest - 0.01, latest) == 1  # ... but it may still come back
    share = p.return_share
    assert not p.claim(latest + 0.01, "a")
    assert p.expired == 1 and p.due(latest + 0.01, 99.0) == 0
    assert p.return_share < share
    for i in range(20):  # clients that do come back raise it again
        p.add(20.0 + i, 1.0, i)
        assert p.claim(20.0 + i, i)
    assert p.return_share > 0.9


def test_due_counts_the_clients_that_may_still_come_back_by_a_time() -> None:
    p = Promises()
    for i, at in enumerate((1.0, 2.0, 3.0, 4.0)):
        p.add(at, 1.0, i)
    p.add(2.5, 1.0)  # keyless: spreads the herd, counted until its time
    assert p.due(0.0, 2.6) == 3
    assert p.claim(2.0, 1)
    assert p.due(2.0, 3.5) == 3  # 0 (late, within its window), 2.5, 3; 1 was kept
    assert p.due(3.6, 10.0) == 2  # 0 expired at 2.0; the keyless one ended at 2.5


def test_a_client_told_again_keeps_only_the_newest_time() -> None:
    p = Promises()
    p.add(5.0, 1.0, "a", owner="t")
    p.add(9.0, 5.0, "a", owner="t")  # came back early, was shed again
    assert p.outstanding(0.0) == 1 and p.held("t") == 1
    assert not p.claim(5.0, "a")  # the first time no longer holds a place
    assert p.claim(9.0, "a") and p.held("t") == 0 and p.expired == 0


def test_past_the_cap_the_earliest_are_forgotten() -> None:
    p = Promises(cap=3)
    for i in range(5):
        p.add(float(i + 1), 1.0, i)
    assert p.outstanding(0.0) == 3
    assert not p.claim(1.0, 0) and p.claim(4.0, 3)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "claim", "due"]),
            st.floats(0.0, 2.0),  # time step
            st.floats(0.0, 5.0),  # wait told
            st.integers(0, 4) | st.none(),  # key
        ),
        max_size=60,
    )
)
def test_matches_a_plain_list(ops: list[tuple[str, float, float, int | None]]) -> None:
    """The lazily cleaned structures answer as a list scanned every time."""
    p = Promises()
    ref: list[tuple[float, float, float, int | None]] = []  # (at, early, until, key)
    now = 0.0
    for op, step, wait, key in ops:
        now += step
        ref = [r for r in ref if r[2] >= now]
        if op == "add":
            at = now + wait
            early, until = window(at, wait) if key is not None else (at, at)
            if key is not None:  # a client told again keeps only the newest time
                ref = [r for r in ref if r[3] != key]
            ref.append((at, early, until, key))
            p.add(at, wait, key)
        elif op == "claim" and key is not None:
            ready = [r for r in ref if r[3] == key and r[1] <= now]
            assert p.claim(now, key) == bool(ready)
            if ready:
                ref.remove(min(ready, key=lambda r: r[0]))
        else:
            assert p.due(now, now + wait) == sum(1 for r in ref if r[0] <= now + wait)
        assert p.outstanding(now) == sum(1 for r in ref if r[0] > now)
