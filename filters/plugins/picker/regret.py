"""Routing regret: what the picker predicted for a request beside what the request saw.

At the pick the picker predicts the tokens the chosen replica will find cached and, once the
replica's latency is learned (:class:`~filters.plugins.picker.latency.LatencyModel`), the time to the
first token from the moment the request leaves for it. At the end of the request the backend's
``usage.prompt_tokens_details.cached_tokens`` and the first chunk's time are known; both pairs
are observed into histograms by pool and replica (``tokenweir_picker_cached_prediction_error``,
``tokenweir_picker_ttft_ratio``), and the actual TTFT teaches the latency model.

Two paths bring the actuals back, as with the usage meters (docs/operations.md "Usage
metering"): the Python usage plugin (the picker's ``stream_end`` reads ``ctx.usage`` and
``ctx.first_token_at``), or Envoy's Lua meter, whose access log entry carries what the picker
set as dynamic metadata at the pick (:meth:`Routed.metadata`) beside the meter's own fields
(:func:`from_log`). The same metadata is in the gateway's JSON access log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

from filters.plugins.picker.coalesce import Lead
from filters.plugins.picker.latency import LatencyModel
from filters.plugins.picker.metrics import PickerMetrics
from wire.jsontypes import JsonObject

__all__ = ["Routed", "from_log", "observe", "step_of"]


@dataclass(slots=True)
class Routed:
    """The picker's decision for one request, kept to its end."""

    replica: str
    uncached: int  # prompt tokens it adds to the replica's backlog (given back at the end)
    lead: Lead | None  # the prefill it leads for coalesced followers
    predicted_cached: int
    work: int = 0  # prompt tokens the replica must prefill before this request's first token
    predicted_ttft: float | None = None  # seconds from ``sent``; None until latency is learned
    sent: float = 0.0  # the picker's clock when the request left for the replica
    running: int = 0  # the picker's requests in flight on the replica with this one (its batch)

    def metadata(self, wall_sent: float) -> JsonObject:
        """Dynamic metadata (namespace ``tokenweir``) for the access log and Envoy's meter;
        ``wall_sent``: ``sent`` on the wall clock (Envoy's Lua timestamps are wall time)."""
        md: JsonObject = {
            "replica": self.replica,
            "predicted_cached_tokens": self.predicted_cached,
            "work_tokens": self.work,
            "sent_us": round(wall_sent * 1e6),
            "running": self.running,
        }
        if self.predicted_ttft is not None:
            md["predicted_ttft_ms"] = round(self.predicted_ttft * 1000, 1)
        return md


class Regret(TypedDict):
    """The inputs of :func:`observe` that one access log entry gives (:func:`from_log`)."""

    replica: str
    predicted_cached: int
    actual_cached: int | None
    prompt_tokens: int
    work: int
    predicted_ttft: float | None
    ttft: float | None
    running: int  # the picker's requests in flight on the replica with this one
    step: float | None  # seconds per output token after the first (None: unknown)


def observe(
    metrics: PickerMetrics,
    model: LatencyModel,
    pool: str,
    replica: str,
    *,
    predicted_cached: int,
    actual_cached: int | None,
    prompt_tokens: int,
    work: int,
    predicted_ttft: float | None,
    ttft: float | None,
    running: int = 0,
    step: float | None = None,
) -> None:
    """One finished request's regret; ``actual_cached`` None or ``prompt_tokens`` 0: the
    backend reported no usage; ``ttft`` None: no token came. ``step``: seconds per output token
    after the first, in a batch of ``running`` (None: fewer than two tokens); it teaches the
    model the replica's decode step (``routing.tpot_budget``)."""
    if step is not None:
        model.observe_step(replica, running, step)
    if actual_cached is not None and prompt_tokens > 0:
        error = (actual_cached - predicted_cached) / prompt_tokens
        metrics.cached_error.labels(pool, replica).observe(error)
    if ttft is None or ttft < 0:
        return
    if predicted_ttft is not None and predicted_ttft > 0:
        metrics.ttft_ratio.labels(pool, replica).observe(ttft / predicted_ttft)
    model.observe(replica, work, ttft)


def from_log(md: Mapping[str, object]) -> Regret | None:
    """The regret inputs of one access log entry of a metered request (``md``: its
    ``tokenweir`` fields), or None when the picker did not place it. ``ttft`` runs from the
    pick's ``sent_us`` to the meter's first chunk (both wall clock, microseconds)."""
    replica = md.get("replica")
    predicted = md.get("predicted_cached_tokens")
    if not isinstance(replica, str) or not isinstance(predicted, float):
        return None
    ttft: float | None = None
    completion = md.get("completion_tokens")
    step: float | None = None
    timing, sent = md.get("timing"), md.get("sent_us")
    if isinstance(timing, str) and timing and isinstance(sent, float):
        parts = timing.split(",")
        if len(parts) >= 2 and int(parts[0]) > 0:
            ttft = (int(parts[1]) - sent) / 1e6
        if len(parts) >= 3 and isinstance(completion, float) and completion > 1:
            step = step_of(int(parts[1]) / 1e6, int(parts[2]) / 1e6, int(completion))
    cached = md.get("cached_tokens")
    reported = isinstance(completion, float)
    predicted_ttft = md.get("predicted_ttft_ms")
    return Regret(
        replica=replica,
        predicted_cached=int(predicted),
        actual_cached=int(cached)
        if reported and isinstance(cached, float)
        else (0 if reported else None),
        prompt_tokens=_whole(md.get("prompt_tokens")) if reported else 0,
        work=_whole(md.get("work_tokens")),
        predicted_ttft=predicted_ttft / 1000 if isinstance(predicted_ttft, float) else None,
        ttft=ttft,
        running=_whole(md.get("running")),
        step=step,
    )


def _whole(value: object) -> int:
    """A count the access log carries as a number (protobuf Struct: a float); 0 when absent."""
    return int(value) if isinstance(value, int | float) else 0


def step_of(first: float, last: float, completion_tokens: int) -> float | None:
    """Seconds per output token after the first (None: fewer than two, or no time between)."""
    if completion_tokens < 2 or last <= first:
        return None
    return (last - first) / (completion_tokens - 1)
