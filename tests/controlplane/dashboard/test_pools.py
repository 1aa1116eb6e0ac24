"""Pool rows: the ladder's step, admission's capacity, and answers by status from Envoy's
cluster stats and the filter server's refusals (texts as the real registries write them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from controlplane.dashboard.pools import answers, pool_rows, route_pools
from controlplane.dashboard.summary import totals_of
from filters.metrics import FilterMetrics
from filters.plugins.admission.metrics import AdmissionMetrics
from policy.loader import load_policy_text
from tests.controlplane.dashboard.test_view import POLICY

# what Envoy's /stats/prometheus says of the example's route cluster (the pool's aggregate with
# its fallback: the router and the rate-limit filter charge that one)
ENVOY = """# TYPE envoy_cluster_upstream_rq_xx counter
envoy_cluster_upstream_rq_xx{envoy_response_code_class="2",envoy_cluster_name="pool_chat_with_fallback"} 14
envoy_cluster_upstream_rq_xx{envoy_response_code_class="4",envoy_cluster_name="pool_chat_with_fallback"} 6
envoy_cluster_upstream_rq_xx{envoy_response_code_class="5",envoy_cluster_name="pool_chat_with_fallback"} 3
envoy_cluster_upstream_rq_xx{envoy_response_code_class="2",envoy_cluster_name="tokenweir_ratelimit"} 40
# TYPE envoy_cluster_upstream_rq counter
envoy_cluster_upstream_rq{envoy_response_code="200",envoy_cluster_name="pool_chat_with_fallback"} 14
envoy_cluster_upstream_rq{envoy_response_code="429",envoy_cluster_name="pool_chat_with_fallback"} 5
envoy_cluster_upstream_rq{envoy_response_code="404",envoy_cluster_name="pool_chat_with_fallback"} 1
envoy_cluster_upstream_rq{envoy_response_code="503",envoy_cluster_name="pool_chat_with_fallback"} 2
envoy_cluster_upstream_rq{envoy_response_code="500",envoy_cluster_name="pool_chat_with_fallback"} 1
"""


def _filters(*, ladder_step: int, later: int = 0) -> str:
    m = FilterMetrics(CollectorRegistry())
    m.rejected("llm", "degraded", 503)
    for _ in range(2 + later):
        m.rejected("llm", "queue_full", 429)
    m.rejected("llm", "too_large", 413)
    m.rejected("other-route", "too_large", 413)  # not a route of this pool
    adm = AdmissionMetrics(m.registry)
    adm.limit.labels("chat").set(12)
    adm.in_flight.labels("chat").set(3)
    adm.queued.labels("chat", "batch").set(4)
    text = generate_latest(m.registry).decode()
    return text + f'tokenweir_filters_ladder_step{{pool="chat"}} {ladder_step}.0\n'


def test_answers_by_status_from_envoy_and_the_filter_server() -> None:
    policy = load_policy_text(POLICY, "mesh.yaml")
    totals = totals_of([_filters(ladder_step=1), _filters(ladder_step=2), ENVOY])
    assert route_pools(policy) == {"llm": "chat"}
    # 429: Envoy's 5 (the rate-limit filter's) + the filter server's 2 + 2 (two processes)
    assert answers(totals, "chat", route_pools(policy)) == {
        "2xx": 14, "429": 9, "4xx": 1 + 2, "503": 2 + 2, "5xx": 1, "requests": 31,
    }  # fmt: skip
    (row,) = pool_rows(policy, totals, None, 0.0)
    assert row["ladder_step"] == 2  # the highest of the processes
    assert (row["admission_capacity"], row["in_flight"], row["queued"]) == (24.0, 6.0, 8)
    assert row["per_s"] is None


def test_rates_are_over_the_given_interval() -> None:
    policy = load_policy_text(POLICY, "mesh.yaml")
    old = totals_of([_filters(ladder_step=0), ENVOY])
    new = totals_of([_filters(ladder_step=0, later=10), ENVOY])
    (row,) = pool_rows(policy, new, (100.0, old), 105.0)
    assert row["per_s"]["429"] == 2.0 and row["per_s"]["2xx"] == 0.0
    assert row["per_s"]["requests"] == 2.0
