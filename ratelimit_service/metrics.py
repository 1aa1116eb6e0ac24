"""Prometheus metrics of one service process (its own registry: no global state).

Every name is in docs/metrics.md. Tenant and quota label values are folded through the policy
(``configure``): a tenant the policy does not name counts as ``other`` and gets no quota gauges.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from policy.labels import OTHER, PolicyLabels
from policy.model import Policy
from quota.config import Limit
from ratelimit_service.limiter import Outcome

__all__ = ["Metrics"]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "tokenweir_ratelimit_decisions",
            "Rate-limit decisions by result (ok, over_limit, invalid, unavailable) and quota",
            ["result", "quota"],
            registry=r,
        )
        self.shadow_denials = Counter(
            "tokenweir_ratelimit_shadow_denials",
            "Requests a shadow-mode quota would have denied (admitted anyway)",
            ["quota"],
            registry=r,
        )
        self.tokens = Counter(
            "tokenweir_ratelimit_tokens",
            "Tokens reserved at admission, settled (real cost), refunded and charged extra",
            ["kind"],
            registry=r,
        )
        self.settles = Counter(
            "tokenweir_ratelimit_settles",
            "Stream-done settlements: settled, not_found (expired or repeated), local, lost",
            ["result"],
            registry=r,
        )
        self.redis_seconds = Histogram(
            "tokenweir_ratelimit_redis_seconds",
            "Latency of one Redis pipeline (a batch of decisions)",
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=r,
        )
        self.decision_seconds = Histogram(
            "tokenweir_ratelimit_decision_seconds",
            "Time from receiving a request to having its answer (inside the service)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.5),
            registry=r,
        )
        self.redis_batch = Histogram(
            "tokenweir_ratelimit_redis_batch_size",
            "Decisions per Redis pipeline",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.redis_errors = Counter(
            "tokenweir_ratelimit_redis_errors", "Redis errors and timeouts", ["kind"], registry=r
        )
        self.redis_up = Gauge("tokenweir_ratelimit_redis_up", "1 while Redis answers", registry=r)
        self.fallbacks = Counter(
            "tokenweir_ratelimit_fallback_decisions",
            "Decisions taken without Redis (mode open: local bucket; closed: denied)",
            ["mode"],
            registry=r,
        )
        self.tls_renewals = Counter(
            "tokenweir_ratelimit_tls_renewals",
            "renewed TLS files of the gRPC port loaded before a new connection's handshake, by "
            "result (ok, error: refused, the old certificate kept)",
            ["result"],
            registry=r,
        )
        self.bad_requests = Counter(
            "tokenweir_ratelimit_bad_requests",
            "Requests from Envoy that could not be judged, by reason",
            ["reason"],
            registry=r,
        )
        self.tenant_decisions = Counter(
            "tokenweir_ratelimit_tenant_decisions",
            "Reserve decisions per tenant (ok, over_limit); unknown tenants count as other",
            ["tenant", "result"],
            registry=r,
        )
        self.outage_charges = Counter(
            "tokenweir_ratelimit_outage_charges",
            "Subjects whose spending from the local buckets while Redis was down was charged "
            "into Redis once it answered (charged; refused: already in debt; failed: Redis "
            "failed again, retried later)",
            ["result"],
            registry=r,
        )
        self.outage_tokens = Counter(
            "tokenweir_ratelimit_outage_charged_tokens",
            "Tokens spent from the local buckets while Redis was down, charged into Redis after",
            registry=r,
        )
        self.false_rejects = Counter(
            "tokenweir_ratelimit_false_rejects",
            "Token 429s whose tenant had room after all: its settlements within a minute "
            "refunded at least what the refused request lacked (ratelimit_service/false_rejects.py)",
            ["tenant"],
            registry=r,
        )
        self.retry_after = Histogram(
            "tokenweir_ratelimit_retry_after_seconds",
            "Retry-After given with a denial, per tenant",
            ["tenant"],
            buckets=(1, 2, 5, 10, 30, 60, 300, 900, 3600, 86400, 2678400),
            registry=r,
        )
        self.quota_limit = Gauge(
            "tokenweir_quota_limit",
            "Size of a tenant's limit (tokens; usd limits in micro-USD) as last checked",
            ["tenant", "quota", "unit"],
            registry=r,
        )
        self.quota_remaining = Gauge(
            "tokenweir_quota_remaining",
            "What a tenant's limit still admits, as of its last check (may go negative: debt)",
            ["tenant", "quota", "unit"],
            registry=r,
        )
        self.redis_up.set(1)
        self.labels = PolicyLabels.empty()
        self._quota_children: dict[tuple[str, str, str], tuple[Gauge, Gauge]] = {}

    def configure(self, policy: Policy) -> None:
        """Fold label values through ``policy`` from now on (at start and on every reload)."""
        self.labels = PolicyLabels.of(policy)
        self._quota_children.clear()

    def tenant_label(self, tenant: str | None) -> str:
        return self.labels.tenant(tenant)

    def observe_quota(
        self, tenant: str, limits: Sequence[Limit], outcomes: Sequence[Outcome]
    ) -> None:
        """Limit and remaining of every limit a reserve of a policy tenant checked."""
        if self.labels.tenant(tenant) == OTHER:
            return
        for lim, o in zip(limits, outcomes, strict=False):
            key = (tenant, lim.quota, lim.unit)
            pair = self._quota_children.get(key)
            if pair is None:
                if len(self._quota_children) > 50_000:
                    self._quota_children.clear()
                q = self.labels.quota(lim.quota)
                pair = self._quota_children[key] = (
                    self.quota_limit.labels(tenant, q, lim.unit),
                    self.quota_remaining.labels(tenant, q, lim.unit),
                )
            pair[0].set(lim.limit)
            pair[1].set(o.remaining)

    def observe_batch(self, seconds: float, size: int) -> None:
        self.redis_seconds.observe(seconds)
        self.redis_batch.observe(size)
