"""runtime.metrics_text: the page equals prometheus_client.generate_latest's, byte for byte, on
every kind of registry, before and after its cache is warm, and as values and series change."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from filters.metrics import FilterMetrics
from runtime.metrics_text import TextRenderer

# label values as hostile as text gets: quotes, backslashes, newlines, NUL, non-ASCII
values = st.text(alphabet=st.sampled_from([*'ab"\\\n\x00é€{}=, ', "\U0001f600"]), max_size=6)
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-9, 1e22, 123456789.0, 1234567.5, -1e300, 5e-324]),
    st.integers(min_value=-(10**20), max_value=10**20),
)


def same(registry: Any) -> TextRenderer:
    r = TextRenderer(registry)
    want = generate_latest(registry)
    assert r.render() == want  # cold
    assert r.render() == want  # warm
    return r


class Custom:
    """A collector yielding families built by hand: every type, timestamps, odd names."""

    def __init__(self, label: str, value: float, ts: float | None) -> None:
        self.label, self.value, self.ts = label, value, ts

    def collect(self) -> list[Metric]:
        g = GaugeMetricFamily("tw_custom_gauge", 'doc with "quotes"\nand \\', labels=["a"])
        g.add_metric([self.label], self.value, timestamp=self.ts)
        c = CounterMetricFamily("tw_custom", "a counter", labels=["a"], created=1.5)
        c.add_metric([self.label], abs(self.value) if not math.isnan(self.value) else 1.0)
        s = SummaryMetricFamily("tw_custom_summary", "s", count_value=3, sum_value=self.value)
        gh = GaugeHistogramMetricFamily(
            "tw_custom_gh", "gh", buckets=[("1.0", 2), ("+Inf", 3)], gsum_value=self.value
        )
        i = InfoMetricFamily("tw_custom_build", "info", value={"version": self.label})
        ss = StateSetMetricFamily("tw_custom_state", "ss", value={"on": True, "off": False})
        u = UnknownMetricFamily("tw_custom_unknown", "u", value=self.value)
        odd = Metric("tw.custom-odd", "a name the text format must escape", "gauge")
        odd.samples = [Sample("tw.custom-odd", {"lé": self.label, "x-y": "1"}, self.value, None)]
        late = Metric("tw_custom_late", "suffixed samples in an odd order", "gaugehistogram")
        late.samples = [
            Sample("tw_custom_late_gsum", {}, self.value, None),
            Sample("tw_custom_late_created", {}, 1.0, None),
            Sample("tw_custom_late_gcount", {}, 2.0, self.ts),
            Sample("tw_custom_late_bucket", {"le": "+Inf"}, 2.0, None),
        ]
        return [g, c, s, gh, i, ss, u, odd, late]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    labels=st.lists(values, min_size=1, max_size=4),
    observations=st.lists(numbers, min_size=1, max_size=5),
    ts=st.one_of(st.none(), st.floats(min_value=0, max_value=2e9)),
)
def test_the_page_equals_generate_latest(
    labels: list[str], observations: list[float], ts: float | None
) -> None:
    registry = CollectorRegistry()
    counter = Counter("tw_things", "things", ["tenant", "le_x"], registry=registry)
    gauge = Gauge("tw_level", "a level", ["tenant"], registry=registry)
    hist = Histogram(
        "tw_latency_seconds", "latency", ["tenant"], buckets=(0.005, 0.5, 1.0, 1e6),
        registry=registry,
    )  # fmt: skip
    summary = Summary("tw_size", "size", ["tenant"], registry=registry)
    Info("tw_build", "build", registry=registry).info({"version": labels[0]})
    Enum("tw_state", "state", states=["a", "b"], registry=registry).state("b")
    Gauge("tw_plain", "no labels", registry=registry).set(observations[0])
    registry.register(Custom(labels[0], float(observations[0]), ts))  # type: ignore[arg-type]
    for tenant in labels:
        for x in observations:
            counter.labels(tenant, "v").inc(abs(x) if math.isfinite(x) else 1)
            gauge.labels(tenant).set(x)
            if math.isfinite(x):
                hist.labels(tenant).observe(x)
                summary.labels(tenant).observe(x)
    r = same(registry)
    # values move, a series comes, one goes: the warm cache still writes the library's page
    gauge.labels(labels[0]).set(-observations[-1] if math.isfinite(observations[-1]) else 0)
    hist.labels("new" + labels[-1]).observe(0.1)
    counter.remove(labels[0], "v")
    assert r.render() == generate_latest(registry)


def test_a_filter_servers_page_equals_generate_latest() -> None:
    m = FilterMetrics()
    for i in range(5):
        m.ttft.labels(f"t{i}", "llama", "interactive").observe(0.2 * i)
        m.tbt.labels(f"t{i}", "llama", "batch").observe(0.01)
        m.tokens.labels(f"t{i}", "llama", "prompt").inc(7)
    same(m.registry)


def test_label_order_does_not_matter_and_the_cache_stays_bounded() -> None:
    class Two:
        def collect(self) -> list[Metric]:
            m = Metric("tw_two", "two", "gauge")
            m.samples = [
                Sample("tw_two", {"a": "1", "b": "2"}, 1.0, None),
                Sample("tw_two", {"b": "2", "a": "1"}, 2.0, None),  # same set, other order
                Sample("tw_two", {"a": "3", "b": "4"}, 3.0, None),
            ]
            return [m]

    registry = CollectorRegistry()
    registry.register(Two())  # type: ignore[arg-type]
    r = TextRenderer(registry, max_series=2)
    want = generate_latest(registry)
    for _ in range(3):
        assert r.render() == want
        assert len(r._series) <= 2


def test_a_failing_collector_is_named_as_generate_latest_names_it() -> None:
    class Bad:
        def collect(self) -> list[Metric]:
            m = Metric("tw_bad", "bad", "gauge")
            m.samples = [Sample("tw_bad", {"a": 1}, 1.0, None)]  # type: ignore[dict-item]
            return [m]

    registry = CollectorRegistry()
    registry.register(Bad())  # type: ignore[arg-type]
    with pytest.raises(Exception) as lib:
        generate_latest(registry)
    with pytest.raises(type(lib.value)) as ours:
        TextRenderer(registry).render()
    assert isinstance(ours.value.args[-1], Metric) and ours.value.args[-1].name == "tw_bad"
