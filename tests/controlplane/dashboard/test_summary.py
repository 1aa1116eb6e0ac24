"""The dashboard's arithmetic: metric texts of the real services' registries → totals → points."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.dashboard.errors import SourceError
from controlplane.dashboard.summary import point_between, quantile, totals_of
from filters.metrics import FilterMetrics
from filters.plugins.admission.gate import AdmissionMetrics
from ratelimit_service.metrics import Metrics as RateLimitMetrics


def _filters_text(tokens: int, ttfts: list[float]) -> str:
    m = FilterMetrics(CollectorRegistry())
    prompt, completion, cached = m.token_counters("acme", "m1")
    prompt.inc(tokens)
    completion.inc(2 * tokens)
    cached.inc(tokens // 2)
    ttft, tbt = m.stream_timers("acme", "m1")
    for x in ttfts:
        ttft.observe(x)
        tbt.observe(x / 10)
        m.stream_started("llm")
    m.rejected("llm", "too_large", 413)
    adm = AdmissionMetrics(m.registry)
    adm.admitted.labels("chat", "interactive", "now").inc(5)
    adm.shed.labels("chat", "batch", "full").inc(2)
    adm.queued.labels("chat", "batch").set(3)
    return generate_latest(m.registry).decode()


def _ratelimit_text() -> str:
    m = RateLimitMetrics(CollectorRegistry())
    m.decisions.labels("over_limit", "tokens.per_minute").inc(3)
    for s in (2, 4, 6):
        m.retry_after.labels("acme").observe(s)
    return generate_latest(m.registry).decode()


def test_totals_sum_every_process_of_the_real_registries() -> None:
    t = totals_of([_filters_text(10, [0.02, 0.2]), _filters_text(5, [0.02]), _ratelimit_text()])
    assert t.tokens[("acme", "prompt")] == 15 and t.tokens[("acme", "completion")] == 30
    assert t.tokens[("acme", "cached")] == 7
    assert t.streams == 3
    assert t.ttft[math.inf] == 3 and t.ttft[0.025] == 2
    assert t.admitted[("chat", "interactive")] == 10 and t.shed[("chat", "batch")] == 4
    assert t.queued[("chat", "batch")] == 6
    assert t.rejections == {"too_large": 2}
    assert t.decisions == {"over_limit": 3}
    assert t.retry_count == {"acme": 3} and t.retry_sum == {"acme": 12}


def test_unparsable_text_is_a_source_error() -> None:
    with pytest.raises(SourceError):
        totals_of(['tokenweir_filters_streams_total{route="a" 1\n'])


def test_quantile_interpolates_like_histogram_quantile() -> None:
    buckets = {0.1: 50.0, 0.2: 90.0, 0.5: 100.0, math.inf: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.7, buckets) == pytest.approx(0.15)
    assert quantile(0.95, buckets) == pytest.approx(0.35)
    assert quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None
    assert quantile(0.99, {0.1: 1.0, math.inf: 10.0}) == pytest.approx(0.1)  # past the last bound


def test_point_rates_and_quantiles_cover_only_the_interval() -> None:
    old = totals_of([_filters_text(10, [0.02] * 4)])
    new = totals_of([_filters_text(30, [0.02] * 4 + [2.0] * 4)])
    p = point_between(old, 100.0, new, 102.0)
    assert p.requests_per_s == pytest.approx(2.0)
    assert p.prompt_tokens_per_s == pytest.approx(10.0)
    assert p.completion_tokens_per_s == pytest.approx(20.0)
    assert 1.0 < p.ttft_p50 <= 2.5  # only the slow ones finished in this interval
    same = point_between(new, 102.0, new, 103.0)
    assert same.requests_per_s == 0 and same.ttft_p50 is None


def test_a_restarted_process_never_gives_negative_rates() -> None:
    old = totals_of([_filters_text(50, [0.02] * 9)])
    new = totals_of([_filters_text(5, [0.02])])
    p = point_between(old, 0.0, new, 1.0)
    assert p.requests_per_s == 0 and p.prompt_tokens_per_s == 0 and p.ttft_p50 is None


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["acme", 'b,le="9"', 'q"uote', "x\\y"]),
            st.sampled_from(["interactive", "batch", None]),
            st.floats(0.0, 40.0),
        ),
        max_size=30,
    )
)
def test_bucket_lines_read_fast_equal_the_parsers_sums(
    obs: list[tuple[str, str | None, float]],
) -> None:
    """TTFT / TBT buckets are read off their lines without the parser (summary._BUCKET_LINE):
    the same sums by bound as prometheus_client's parser, label values with quotes, commas and
    ``le="`` inside them included."""
    m = FilterMetrics(CollectorRegistry())
    for tenant, lane, x in obs:
        ttft, tbt = m.stream_timers(tenant, "m1", lane)
        ttft.observe(x)
        tbt.observe(x / 100)
    text = generate_latest(m.registry).decode()
    want: dict[str, dict[float, float]] = {"ttft": {}, "tbt": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            for kind in want:
                if s.name == f"tokenweir_filters_{kind}_seconds_bucket":
                    le = float(s.labels["le"])
                    want[kind][le] = want[kind].get(le, 0.0) + s.value
    t = totals_of([text])
    assert (t.ttft, t.tbt) == (want["ttft"], want["tbt"])
