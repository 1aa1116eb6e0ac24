"""The admission gates' Prometheus metrics (one set per filter process, labelled by pool)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["AdmissionMetrics"]

_WAIT = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "tokenweir_admission_"
        r = registry
        self.queued = Gauge(p + "queued", "requests waiting", ["pool", "lane"], registry=r)
        self.in_flight = Gauge(p + "in_flight", "admitted requests running", ["pool"], registry=r)
        self.limit = Gauge(p + "limit", "requests this process may admit", ["pool"], registry=r)
        self.reserved = Gauge(
            p + "reserved",
            "free slots a lane leaves for the lanes above it (their measured demand)",
            ["pool", "lane"],
            registry=r,
        )
        self.admitted = Counter(
            p + "admitted", "requests admitted", ["pool", "lane", "how"], registry=r
        )
        self.shed = Counter(
            p + "shed", "requests answered at once", ["pool", "lane", "reason"], registry=r
        )
        self.wait = Histogram(
            p + "wait_seconds", "time admitted requests waited", ["pool", "lane"],
            buckets=_WAIT, registry=r,
        )  # fmt: skip
        self.returns = Counter(
            p + "returns",
            "clients told a Retry-After: came back in time (claimed: served before fresh "
            "arrivals) or not (expired)",
            ["pool", "lane", "outcome"], registry=r,
        )  # fmt: skip
        self.scale_up_promises = Counter(
            p + "retry_after_shortened",
            "Retry-After promises cut to when a starting replica should serve (scale-up)",
            ["pool"], registry=r,
        )  # fmt: skip
        self.ranked = Gauge(
            p + "ranked",
            "1 while the lanes above the lowest are admitted past the slots lower lanes hold "
            "(priority_scheduling declared, no answering replica contradicts it)",
            ["pool"], registry=r,
        )  # fmt: skip
