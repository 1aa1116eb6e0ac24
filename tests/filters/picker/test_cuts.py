"""Where checkpoints fall: evenly for the first band, then bands of doubling spacing."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from filters.plugins.picker.cuts import BAND, cut_end, cuts, cuts_within
from filters.plugins.picker.prompt import checkpoints


def test_the_first_band_is_even_then_each_band_doubles_the_length() -> None:
    step = 100
    assert [cut_end(k, step) for k in range(BAND + 1)] == [k * step for k in range(BAND + 1)]
    assert cut_end(BAND + 1, step) == BAND * step + 2 * step
    assert cut_end(BAND + BAND // 2, step) == 2 * BAND * step  # the first band of doubled cuts
    assert cut_end(BAND + BAND, step) == 4 * BAND * step
    assert cut_end(BAND + 3 * (BAND // 2), step) == 8 * BAND * step


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 50_000_000), st.integers(1, 4096))
def test_cuts_within_is_the_last_cut_at_or_before(n: int, step: int) -> None:
    k = cuts_within(n, step)
    assert cut_end(k, step) <= n < cut_end(k + 1, step)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2_000_000), st.integers(64, 4096))
def test_the_cuts_walk_the_same_ends(n: int, step: int) -> None:
    walked = list(cuts(n, step))
    assert [end for _, end in walked] == [cut_end(k, step) for k in range(1, len(walked) + 1)]
    assert len(walked) == cuts_within(n, step)
    assert all(start == end for (_, end), (start, _) in itertools.pairwise(walked))


def test_a_long_prompt_has_logarithmically_many_checkpoints_known_within_a_32nd() -> None:
    step = 1024
    assert len(checkpoints(b"x" * (64 * 1024), step)) == 64
    assert len(checkpoints(b"x" * (300 * 1024), step)) == 133  # evenly spaced: 300
    for k in range(BAND + 1, 400):
        assert cut_end(k, step) - cut_end(k - 1, step) <= cut_end(k - 1, step) / 16


def test_prompts_sharing_a_prefix_share_its_checkpoints_whatever_their_lengths() -> None:
    doc = bytes(range(256)) * 800  # 200 KiB
    a, b = (
        checkpoints(doc + b"question one", 512),
        checkpoints(doc[:150_000] + b"other" * 9000, 512),
    )
    shared = cuts_within(150_000, 512)
    assert a[:shared] == b[:shared] and a[shared] != b[shared]
