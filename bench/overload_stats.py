"""Pure summaries of the overload benchmark's attempt records: per-lane results, time series,
and the issue's targets at 3x.

Definitions (docs/benchmarks.md, "Overload"):

- *success*: a logical request whose last attempt streamed to its finish and ``[DONE]``;
  *first-try success*: its first attempt did.
- *TTFT*: from the logical request's first send to the first token of its successful attempt
  (what the user waited, retries included); *TBT*: gaps between a stream's tokens.
- *goodput*: tokens of successful attempts received inside the window (the offered-load window
  minus a warm-up), per second.
- *rejection*: an attempt answered with an error status before any token; its latency is send
  to status line. *Retry-After accuracy*: of the attempts sent after waiting as a Retry-After
  said, the share that got in (an answer with status 200).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from overload_client import Attempt

__all__ = ["percentile", "replica_lane_summary", "summarize", "targets", "timeline"]

LANES = ("interactive", "batch")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def _ms(v: float | None) -> float | None:
    return None if v is None else round(1000.0 * v, 2)


def _share(num: int, den: int) -> float | None:
    return None if den == 0 else round(num / den, 4)


def summarize(
    attempts: Iterable[Attempt], *, window: tuple[float, float]
) -> dict[str, dict[str, Any]]:
    """Per lane (and ``all``): the benchmark's columns for one arm at one load level."""
    by_req: dict[int, list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_req[a.request].append(a)
    lo, hi = window
    out: dict[str, dict[str, Any]] = {}
    for lane in (*LANES, "all"):
        reqs = [sorted(v, key=lambda a: a.number) for v in by_req.values()]
        if lane != "all":
            reqs = [r for r in reqs if r[0].lane == lane]
        flat = [a for r in reqs for a in r]
        ok = [r for r in reqs if r[-1].ok]
        ttft = [r[-1].first_token - r[0].sent for r in ok if r[-1].first_token is not None]
        gaps = [
            t2 - t1
            for r in ok
            for t1, t2 in zip(r[-1].token_times, r[-1].token_times[1:], strict=False)
        ]
        tokens = sum(1 for r in ok for t in r[-1].token_times if lo <= t < hi)
        rejected = [a for a in flat if a.rejected]
        told = [a for a in flat if a.told_to_wait is not None]
        out[lane] = {
            "requests": len(reqs),
            "attempts": len(flat),
            "success_rate": _share(len(ok), len(reqs)),
            "first_try_success": _share(sum(1 for r in reqs if r[0].ok), len(reqs)),
            "abandoned": sum(1 for a in flat if a.error == "abandoned"),
            "stream_errors": sum(1 for a in flat if a.error == "stream"),
            # no HTTP answer, not abandoned: the client does not retry these (by exception)
            "connection_errors": _count(a.error for a in flat if a.error.startswith("connection")),
            "goodput_tok_s": round(tokens / (hi - lo), 2) if hi > lo else None,
            "ttft_ms": {f"p{q}": _ms(percentile(ttft, q / 100)) for q in (50, 95, 99)},
            "tbt_ms": {f"p{q}": _ms(percentile(gaps, q / 100)) for q in (50, 95, 99)},
            "rejections": len(rejected),
            "rejection_statuses": _count(str(a.status) for a in rejected),
            "rejection_ms_p99": _ms(
                percentile([a.answered - a.sent for a in rejected if a.answered is not None], 0.99)
            ),
            # answered at arrival (queue full, wait too long, deadline, quota), not after a wait
            "immediate_rejection_ms_p99": _ms(
                percentile(
                    [
                        a.answered - a.sent
                        for a in rejected
                        if a.answered is not None and a.error not in QUEUED_SHEDS
                    ],
                    0.99,
                )
            ),
            "rejection_ms_p99_by_reason": {
                code: _ms(percentile([a.answered - a.sent for a in group if a.answered], 0.99))
                for code, group in _group(rejected).items()
            },
            "rejection_ms_by_reason": {
                code: _latencies([a.answered - a.sent for a in group if a.answered is not None])
                for code, group in _group(rejected).items()
            },
            "rejections_with_retry_after": _share(
                sum(1 for a in rejected if a.retry_after is not None), len(rejected)
            ),
            "retry_after_accuracy": _share(sum(1 for a in told if a.admitted), len(told)),
            "retries_after_retry_after": len(told),
            "attempts_per_success": round(len(flat) / len(ok), 3) if ok else None,
        }
    return out


def _latencies(values: Sequence[float]) -> dict[str, Any]:
    """How many, and their p50 / p99 in ms."""
    return {
        "n": len(values),
        "p50": _ms(percentile(values, 0.5)),
        "p99": _ms(percentile(values, 0.99)),
    }


# a request answered after it waited in a gateway queue: its wait is part of its answer time
QUEUED_SHEDS = frozenset({"fell_behind", "timed_out"})


def _group(attempts: Iterable[Attempt]) -> dict[str, list[Attempt]]:
    """Rejected attempts by their answer's error code (``queue_full``, ``timed_out``, …)."""
    out: dict[str, list[Attempt]] = defaultdict(list)
    for a in attempts:
        out[a.error or "http"].append(a)
    return dict(sorted(out.items()))


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for i in items:
        out[i] += 1
    return dict(sorted(out.items()))


def timeline(attempts: Iterable[Attempt], *, bucket: float, end: float) -> dict[str, list[float]]:
    """Per-second rates in buckets of ``bucket`` s: attempts sent (offered), streams started
    (first token: admitted to the GPU), rejections; per lane and in all."""
    n = max(1, math.ceil(end / bucket))
    series: dict[str, list[float]] = {
        f"{kind}_{lane}": [0.0] * n
        for kind in ("offered", "started", "rejected")
        for lane in (*LANES, "all")
    }

    def add(kind: str, lane: str, t: float | None) -> None:
        if t is None or not 0 <= t < n * bucket:
            return
        i = int(t / bucket)
        series[f"{kind}_{lane}"][i] += 1.0 / bucket
        series[f"{kind}_all"][i] += 1.0 / bucket

    for a in attempts:
        add("offered", a.lane, a.sent)
        add("started", a.lane, a.first_token)
        if a.rejected:
            add("rejected", a.lane, a.answered)
    series["t"] = [round((i + 0.5) * bucket, 3) for i in range(n)]
    return series


def targets(levels: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's targets at 3x for one arm, from its per-level summaries (keyed by ``"0.25x"``,
    ``"1x"``, ``"3x"`` …; the lowest level, when it is below 1x, is the unloaded reference: a run
    without one cannot say how 3x compares, and 3x is not compared with itself). Each row: name,
    target, measured, met (None when it could not be measured)."""
    keys = sorted(levels, key=lambda k: float(k.rstrip("x")))
    top = levels.get("3x")
    idle = levels[keys[0]] if float(keys[0].rstrip("x")) < 1.0 else None
    one = levels.get("1x")
    if top is None:
        return []
    ti, tb = top["interactive"], top["all"]
    base = idle["interactive"]["ttft_ms"]["p95"] if idle is not None else None
    p95 = ti["ttft_ms"]["p95"]
    ratio = None if base in (None, 0) or p95 is None else round(p95 / base, 2)
    g1 = one["all"]["goodput_tok_s"] if one else None
    g3 = tb["goodput_tok_s"]
    gr = None if not g1 or g3 is None else round(g3 / g1, 3)

    def row(name: str, target: str, measured: Any, ok: bool | None) -> dict[str, Any]:
        return {"name": name, "target": target, "measured": measured, "met": ok}

    rej_p99 = tb["rejection_ms_p99"]
    at_once = tb.get("immediate_rejection_ms_p99")
    ra_share = tb["rejections_with_retry_after"]
    acc = tb["retry_after_accuracy"]
    return [
        row(
            "interactive p95 TTFT vs unloaded",
            "<= 2x",
            ratio,
            None if ratio is None else ratio <= 2.0,
        ),
        row(
            "interactive success",
            ">= 99%",
            ti["success_rate"],
            None if ti["success_rate"] is None else ti["success_rate"] >= 0.99,
        ),
        row(
            "rejection latency p99, answered at arrival",
            "< 10 ms",
            at_once,
            None if at_once is None else at_once < 10.0,
        ),
        row(
            "rejection latency p99, queued then shed included",
            "< 10 ms",
            rej_p99,
            None if rej_p99 is None else rej_p99 < 10.0,
        ),
        row(
            "rejections with Retry-After",
            "100%",
            ra_share,
            None if ra_share is None else ra_share >= 1.0,
        ),
        row("Retry-After accuracy", ">= 90%", acc, None if acc is None else acc >= 0.9),
        row("pool goodput vs 1x", ">= 95%", gr, None if gr is None else gr >= 0.95),
    ]


def replica_lane_summary(
    samples: Sequence[Sequence[dict[str, Any] | None]], interactive: int
) -> dict[str, Any]:
    """Where interactive waits, from the emulators' own views (``/_emulator/state``) sampled
    during a level: the mean interactive requests waiting inside the replicas, the mean gap
    between the replicas running the most and the fewest interactive requests, and the share
    of samples in which interactive waited on one replica while another decoded batch it could
    have preempted."""
    key = str(interactive)
    waiting: list[int] = []
    gaps: list[int] = []
    misplaced = busy = 0
    for states in samples:
        if not states or any(s is None for s in states):
            continue
        views = [s for s in states if s is not None]
        run = [v["running"].get(key, 0) for v in views]
        wait = [v["waiting"].get(key, 0) for v in views]
        decoding_batch = [
            sum(n for p, n in v["running"].items() if p != key)
            - sum(n for p, n in v["prefilling"].items() if p != key)
            for v in views
        ]
        if not any(run) and not any(wait):
            continue  # idle: nothing to place
        busy += 1
        waiting.append(sum(wait))
        gaps.append(max(run) - min(run))
        if any(
            w and any(b for j, b in enumerate(decoding_batch) if j != i) for i, w in enumerate(wait)
        ):
            misplaced += 1
    return {
        "samples": busy,
        "interactive_waiting_in_replicas_mean": _mean(waiting),
        "interactive_running_gap_mean": _mean(gaps),
        "interactive_waiting_beside_preemptable_batch": _share(misplaced, busy),
        "preempted": _preempted(samples[-1]) - _preempted(samples[0]) if samples else 0,
    }


def _preempted(states: Sequence[dict[str, Any] | None]) -> int:
    return sum(int((s or {}).get("preempted_total", 0)) for s in states)


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None
