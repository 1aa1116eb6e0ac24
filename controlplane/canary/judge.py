"""The pure half of the canary watch: samples of cumulative counters, the trailing window
between two of them, p95 from histogram buckets, and the verdict with its hold time.

A :class:`Sample` holds, per version (``baseline``, ``canary``): responses and 5xx answers as
the gateway counted them, and the replicas' cumulative TTFT and inter-token histograms. The
verdict compares the window's canary with its baseline; :class:`Guard` keeps the trailing
samples and asks for a rollback once a breach has lasted ``sustain``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from policy.canary import CanaryRollback

__all__ = ["Guard", "Sample", "Verdict", "VersionCounts", "judge", "p95"]

Buckets = tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending


@dataclass(frozen=True)
class VersionCounts:
    responses: float = 0.0
    errors: float = 0.0  # 5xx
    ttft: Buckets = ()
    tbt: Buckets = ()


@dataclass(frozen=True)
class Sample:
    t: float
    versions: dict[str, VersionCounts] = field(default_factory=dict)

    def of(self, version: str) -> VersionCounts:
        return self.versions.get(version, VersionCounts())


@dataclass(frozen=True)
class Verdict:
    reason: str  # "error_rate", "ttft", "tbt"
    canary: float
    baseline: float
    limit: float
    requests: float

    def __str__(self) -> str:
        return (
            f"{self.reason}: canary {self.canary:.4g} vs baseline {self.baseline:.4g} "
            f"(limit {self.limit:.4g}, {self.requests:.0f} canary requests in the window)"
        )


def _minus(new: Buckets, old: Buckets) -> Buckets:
    before = dict(old)
    return tuple((le, max(0.0, c - before.get(le, 0.0))) for le, c in new)


def p95(buckets: Buckets) -> float | None:
    """The upper bound of the bucket holding the 95th percentile (the largest finite bound when
    it is in the +Inf bucket); None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    want = 0.95 * buckets[-1][1]
    finite = [le for le, _ in buckets if math.isfinite(le)]
    for le, c in buckets:
        if c >= want:
            return le if math.isfinite(le) else (finite[-1] if finite else None)
    return None


def judge(new: Sample, old: Sample, rules: CanaryRollback) -> Verdict | None:
    """The first threshold the canary breaches between ``old`` and ``new``, or None."""
    c_new, c_old = new.of("canary"), old.of("canary")
    b_new, b_old = new.of("baseline"), old.of("baseline")
    requests = c_new.responses - c_old.responses
    if requests < rules.min_requests:
        return None
    errors = (c_new.errors - c_old.errors) / requests
    b_req = b_new.responses - b_old.responses
    b_errors = (b_new.errors - b_old.errors) / b_req if b_req > 0 else 0.0
    if errors > rules.max_error_rate:
        return Verdict("error_rate", errors, b_errors, rules.max_error_rate, requests)
    for reason, ratio, cn, co, bn, bo in (
        ("ttft", rules.max_ttft_ratio, c_new.ttft, c_old.ttft, b_new.ttft, b_old.ttft),
        ("tbt", rules.max_tbt_ratio, c_new.tbt, c_old.tbt, b_new.tbt, b_old.tbt),
    ):
        canary, base = p95(_minus(cn, co)), p95(_minus(bn, bo))
        if canary is None:
            continue
        limit = ratio * max(base or 0.0, rules.latency_floor)
        if canary > limit:
            return Verdict(reason, canary, base or 0.0, limit, requests)
    return None


class Guard:
    """One pool's trailing samples; :meth:`observe` returns a verdict when it is time to roll
    back (the breach has lasted ``sustain``)."""

    def __init__(self, rules: CanaryRollback) -> None:
        self.rules = rules
        self.samples: deque[Sample] = deque()
        self.breach_since: float | None = None
        self.last: Verdict | None = None

    def observe(self, sample: Sample) -> Verdict | None:
        self.samples.append(sample)
        while len(self.samples) > 2 and sample.t - self.samples[1].t >= self.rules.window:
            self.samples.popleft()
        verdict = judge(sample, self.samples[0], self.rules) if len(self.samples) > 1 else None
        self.last = verdict
        if verdict is None:
            self.breach_since = None
            return None
        if self.breach_since is None:
            self.breach_since = sample.t
        return verdict if sample.t - self.breach_since >= self.rules.sustain else None
