"""Label values stay bounded by the policy however many distinct tenants and models arrive."""

from __future__ import annotations

import random
from pathlib import Path

from prometheus_client import CollectorRegistry

from filters.metrics import FilterMetrics
from policy import load_policy
from policy.labels import OTHER, LabelFold, PolicyLabels
from quota.config import Limit
from ratelimit_service.limiter import Outcome
from ratelimit_service.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
POLICY = load_policy(ROOT / "examples" / "mesh.yaml")


def label_values(registry: CollectorRegistry, label: str) -> set[str]:
    return {s.labels[label] for m in registry.collect() for s in m.samples if label in s.labels}


def test_fold_keeps_known_names_and_folds_the_rest() -> None:
    fold = LabelFold(["a", "b"])
    assert [fold("a"), fold("b"), fold("c"), fold(None), fold("")] == [
        "a",
        "b",
        OTHER,
        OTHER,
        OTHER,
    ]
    labels = PolicyLabels.of(POLICY)
    assert labels.quota("models.llama-3.1-8b") == "models.llama-3.1-8b"
    assert labels.quota("models.evil") == "models.other"
    assert labels.quota("lanes.nope") == "lanes.other"
    assert labels.quota("tokens") == "tokens" and labels.quota("garbage") == OTHER


def test_filter_metrics_have_at_most_policy_names_plus_other() -> None:
    m = FilterMetrics(policy=POLICY)
    rnd = random.Random(7)
    for i in range(2000):
        tenant = rnd.choice([*POLICY.tenants, f"t{i}", None])
        model = rnd.choice(["llama-3.1-8b", f"m{i}", None])
        lane = rnd.choice(["interactive", "batch", f"l{i}"])
        ttft, _ = m.stream_timers(tenant, model, lane)
        ttft.observe(0.1)
        for c in m.token_counters(tenant, model):
            c.inc()
        m.request_done("chat-completions", lane, model, tenant, "ok", 0.5)
        m.spent(tenant, model, 0.01)
    assert label_values(m.registry, "tenant") == {*POLICY.tenants, OTHER}
    assert label_values(m.registry, "model") == {"llama-3.1-8b", OTHER}
    assert label_values(m.registry, "lane") == {"interactive", "batch", OTHER}


def test_unconfigured_filter_metrics_would_grow_without_bound() -> None:
    """The fold is what bounds them (this is why the app configures it on every reload)."""
    m = FilterMetrics()
    for i in range(50):
        m.request_done("r", "interactive", "m", f"t{i}", "ok", 0.1)
    assert len(label_values(m.registry, "tenant")) == 50


def test_ratelimit_metrics_have_at_most_policy_names_plus_other() -> None:
    m = Metrics()
    m.configure(POLICY)
    lim = [Limit(f"models.m{i}", "day", 100, 0.0, False, True) for i in range(3)]
    for i in range(500):
        tenant = f"t{i}" if i % 2 else "demo-pro"
        m.tenant_decisions.labels(m.tenant_label(tenant), "ok").inc()
        m.observe_quota(tenant, lim, [Outcome(True, 5, 0)] * 3)
    assert label_values(m.registry, "tenant") == {"demo-pro", OTHER}
    assert label_values(m.registry, "quota") == {"models.other"}


def test_the_tenant_fold_answers_from_the_policy_itself_without_copying_it() -> None:
    """Configuring the metrics on a reload must not walk every tenant on the event loop."""
    labels = PolicyLabels.of(POLICY)
    assert labels.tenant.known is POLICY.tenants
    tenant = next(iter(POLICY.tenants))
    assert labels.tenant(tenant) == tenant and labels.tenant("nobody") == OTHER
