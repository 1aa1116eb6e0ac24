"""Where a prompt's checkpoints fall: ``step`` bytes apart for the first ``BAND``, then each
further ``BAND / 2`` twice as far apart as the last.

With ``step`` = ``routing.checkpoint_bytes`` (1 KiB by default) the first 64 KiB are cut every
KiB, the next 64 KiB every 2 KiB, the next 128 KiB every 4 KiB, and so on. The cuts sit at fixed
offsets from the prompt's start, whatever its length, so two prompts sharing their first bytes
share their checkpoints up to the last cut inside the shared part, as with evenly spaced cuts.

Why not evenly spaced: everything the picker does per request walks a prompt's checkpoints (the
digests, the map lookups, the index walk, the pending picks: docs/benchmarks.md), so evenly
spaced cuts make a request's cost grow with its prompt's length: 300 checkpoints at 300 KiB.
Bands make it grow with the logarithm past the first band: 64 + 32·log2(length / (64·step)),
133 at 300 KiB. What it costs: past the first band a shared prefix is known to within
``2 / BAND`` (1/32) of its length instead of ``step`` bytes, e.g. 4 KiB of 200 KiB.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["BAND", "cut_end", "cuts", "cuts_within"]

BAND = 64  # checkpoints ``step`` apart before the bands start; each band then holds BAND // 2
_HALF = BAND // 2


def cut_end(k: int, step: int) -> int:
    """The byte offset where checkpoint ``k`` ends (checkpoint ``k`` covers ``[0, cut_end)``;
    ``cut_end(0)`` is 0)."""
    if k <= BAND:
        return k * step
    band, i = divmod(k - BAND - 1, _HALF)  # band 0 is the first doubling band
    return (BAND * step << band) + (i + 1) * (step << (band + 1))


def cuts_within(n: int, step: int) -> int:
    """How many whole checkpoints the first ``n`` bytes hold: the largest ``k`` with
    ``cut_end(k) <= n``."""
    first = BAND * step
    if n < first:
        return n // step
    band = (n // first).bit_length() - 1  # n in [first << band, first << (band + 1))
    return BAND + band * _HALF + (n - (first << band)) // (step << (band + 1))


def cuts(n: int, step: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of every whole checkpoint in the first ``n`` bytes, in order."""
    start, size, k = 0, step, 0
    while start + size <= n:
        yield start, start + size
        start += size
        k += 1
        if k >= BAND and (k - BAND) % _HALF == 0:
            size *= 2
