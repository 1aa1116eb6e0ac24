"""Predicted-latency scoring (``routing.scoring: predicted_ttft``, experimental): a pure function.

For each candidate replica (known to the prefix index, not marked unhealthy) the request's
time to first token there is predicted from what the picker knows exactly and the replica's
rates learned online (:meth:`filters.plugins.picker.latency.LatencyModel.rates`):

    work = backlog + prompt_tokens − matched_tokens
    ttft = base + per_token × work + step

``backlog`` is the prompt tokens the picker sent the replica that its KV events have not yet
shown stored (the prefill queued ahead of this request), ``matched_tokens`` the tokens the
prefix index (or a pick of the same prefix still waiting for its events, or a prefill being
coalesced) says it holds, counted as the index counts them: the cached replica's saving is
exactly the tokens it will not prefill. ``base`` is the pool's (the same for every replica: it
does not decide); ``per_token`` the replica's own prefill rate, bounded near the pool's and
shrunk toward it when the replica has lately been observed little, so no replica is ever
predicted unboundedly slow (none is starved) and one sent nothing returns to the pool's rate.
``step`` is the replica's decode step with this request added to the batch the picker has in
flight there (learned from its requests' token gaps against their batch): the first token's
step runs beside the running batch, so a replica piled up with followers of a hot prefix is
predicted slower as its batch grows (0 until learned).

The candidates whose predicted decode step with this request added (``Rates.step_s``) stays
within ``tpot_budget`` are kept (0: no budget; when none does, the one with the shortest step).
Among them, those predicted within the pool's recent prediction error (``Rates.error_s``) of the
fastest are not told apart (a difference smaller than how wrong the predictions usually are is
no reason to give a cache up): of those the replica holding most of the prompt wins (a match shorter than ``min_prefix_tokens``,
a shared system prompt, counts as none: new conversations do not pile up where it is), then the
least prefill work (tokens, known exactly: rates that differ by less than their error do not
decide, else the replica whose fit came out a hair faster would take every tie and the others,
sent nothing, would never be learned again), then the smallest radix tree (as sglang-router's ``cache_aware`` places a
prefix it has not seen), then a rendezvous hash of the prompt's first checkpoint (every gateway
replica breaks ties alike). So a cache hit is given up only when its backlog makes it slower
than prefilling the prompt elsewhere by more than the predictions' error, and a prompt nobody
holds goes where the least prefill is queued. No weight says what a cached token is worth
against a queued one: the replica's rate does.

Reasons as :mod:`~filters.plugins.picker.score`'s: ``cache`` (the winner holds at least
``min_prefix_tokens``), ``load`` (it won on its wait), ``cold`` (no replica known).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from filters.plugins.picker.latency import PRIOR, Rates
from filters.plugins.picker.score import Candidate, Pick
from filters.rendezvous import rendezvous

__all__ = ["Scoring", "choose_ttft", "predicted"]


@dataclass(frozen=True, slots=True)
class Scoring:
    min_prefix_tokens: int = 256  # a match this long makes the reason "cache"
    tpot_budget: float = 0.0  # seconds per output token a replica's predicted step must keep


def predicted(c: Candidate, prompt_tokens: int, rates: Rates) -> tuple[float, int]:
    """The request's predicted TTFT on ``c`` and the prefill work ahead of its first token."""
    work = c.backlog_tokens + max(0, prompt_tokens - c.matched_tokens)
    return rates.ttft(work) + rates.step_s, work


def choose_ttft(
    candidates: Sequence[Candidate],
    prompt_tokens: int,
    scoring: Scoring,
    rates: Callable[[str], Rates],
    tie_key: bytes = b"",
) -> Pick:
    """The replica for one prompt of about ``prompt_tokens`` tokens; see the module docstring.
    ``rates(name)``: the replica's learned rates (:data:`PRIOR` before anything is learned)."""
    live = [c for c in candidates if c.known and c.healthy]
    if not live:
        return Pick(None, "cold")
    of = {c.name: rates(c.name) for c in live}
    budget = scoring.tpot_budget
    if budget > 0:
        within = [c for c in live if of[c.name].step_s <= budget]
        live = within or [min(live, key=lambda c: of[c.name].step_s)]
    ttft = {c.name: predicted(c, prompt_tokens, of[c.name]) for c in live}
    fastest = min(t for t, _ in ttft.values())
    margin = max((of[c.name].error_s for c in live), default=PRIOR.error_s)
    near = [c for c in live if ttft[c.name][0] <= fastest + margin]

    def key(c: Candidate) -> tuple[int, int, int, int]:
        held = c.matched_tokens if c.matched_tokens >= scoring.min_prefix_tokens else 0
        return (-held, ttft[c.name][1], c.cached_blocks, -rendezvous(tie_key, c.name))

    best = min(near, key=key)
    reason = "cache" if best.matched_tokens >= max(1, scoring.min_prefix_tokens) else "load"
    return Pick(best.name, reason, best.matched_tokens, best.matched_bytes)
