"""filters/usage_log.py: one access-log entry of Envoy's usage meter → the gateway metrics."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2
from prometheus_client import Histogram

from controlplane.translate.usage_meter import GAP_BUCKETS
from filters.metrics import _GAP, FilterMetrics
from filters.usage_log import UsageLog, record
from policy import load_policy
from quota.cost import cost_usd
from tests.filters.conftest import ROOT

POLICY = load_policy(ROOT / "examples" / "mesh.yaml")
MODEL = "llama-3.1-8b"


def entry(md: dict[str, Any], duration: float = 0.5) -> accesslog_pb2.HTTPAccessLogEntry:
    e = accesslog_pb2.HTTPAccessLogEntry()
    e.common_properties.metadata.filter_metadata["tokenweir"].update(md)
    e.common_properties.route_name = "envoy-route"
    e.common_properties.duration.FromNanoseconds(int(duration * 1e9))
    return e


def value(m: FilterMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


BASE = {"meter": True, "tenant": "demo-pro", "model": MODEL, "lane": "interactive",
        "route": "chat-completions", "prompt": 30}  # fmt: skip


def test_the_meter_counts_gaps_in_the_buckets_the_histogram_has() -> None:
    assert GAP_BUCKETS == _GAP


def test_a_stream_with_usage_records_every_gateway_metric() -> None:
    m = FilterMetrics(policy=POLICY)
    # 5 chunks, first at t0 + 20 ms, last 400 ms later; gaps: 2 under 5 ms, 2 under 250 ms
    gaps = [0, 0, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0]
    t0 = 1_000_000_000_000
    timing = ",".join(str(x) for x in [5, t0 + 20_000, t0 + 420_000, 402_000, *gaps])
    md = {**BASE, "t0_us": t0, "timing": timing, "outcome": "ok",
          "prompt_tokens": 31, "completion_tokens": 9, "cached_tokens": 8}  # fmt: skip
    record(m, POLICY, entry(md))
    t = {"tenant": "demo-pro", "model": MODEL}
    tl = {**t, "lane": "interactive"}
    assert value(m, "tokenweir_filters_ttft_seconds_sum", **tl) == pytest.approx(0.02)
    assert value(m, "tokenweir_filters_tbt_seconds_count", **tl) == 4
    assert value(m, "tokenweir_filters_tbt_seconds_sum", **tl) == pytest.approx(0.402)
    assert value(m, "tokenweir_filters_tbt_seconds_bucket", **tl, le="0.005") == 2
    assert value(m, "tokenweir_filters_tbt_seconds_bucket", **tl, le="0.1") == 2
    assert value(m, "tokenweir_filters_tbt_seconds_bucket", **tl, le="0.25") == 4
    assert value(m, "tokenweir_filters_tokens_total", **t, kind="prompt") == 31
    assert value(m, "tokenweir_filters_tokens_total", **t, kind="completion") == 9
    assert value(m, "tokenweir_filters_tokens_total", **t, kind="cached") == 8
    spent = value(m, "tokenweir_filters_cost_usd_total", **t, cost_center="other") + value(
        m, "tokenweir_filters_cost_usd_total", **t, cost_center="research"
    )
    assert spent == pytest.approx(cost_usd(POLICY, MODEL, 31, 9, 8))
    assert value(m, "tokenweir_filters_tokens_per_second_count", **t) == 1
    assert value(m, "tokenweir_filters_tokens_per_second_sum", **t) == pytest.approx(8 / 0.4)
    assert value(m, "tokenweir_filters_prompt_estimate_ratio_sum", model=MODEL) == pytest.approx(
        30 / 31
    )
    req = {"route": "chat-completions", "lane": "interactive", "model": MODEL,
           "tenant": "demo-pro", "outcome": "ok"}  # fmt: skip
    assert value(m, "tokenweir_filters_requests_total", **req) == 1
    assert value(
        m, "tokenweir_filters_request_duration_seconds_sum",
        route="chat-completions", lane="interactive", model=MODEL,
    ) == pytest.approx(0.5)  # fmt: skip


def test_an_abandoned_request_without_output_counts_as_no_output() -> None:
    m = FilterMetrics(policy=POLICY)
    UsageLog(m, lambda: POLICY).handle(
        als_pb2.StreamAccessLogsMessage(
            http_logs=als_pb2.StreamAccessLogsMessage.HTTPAccessLogEntries(
                log_entry=[entry({**BASE, "t0_us": 1.0}), entry({"tenant": "x"})]
            )
        ).SerializeToString()
    )
    req = {"route": "chat-completions", "lane": "interactive", "model": MODEL,
           "tenant": "demo-pro", "outcome": "no_output"}  # fmt: skip
    assert value(m, "tokenweir_filters_requests_total", **req) == 1  # the unmetered one: skipped
    assert value(m, "tokenweir_filters_ttft_seconds_count", tenant="demo-pro", model=MODEL,
                 lane="interactive") == 0  # fmt: skip


def test_bucket_counts_add_what_observe_would_have() -> None:
    gaps = [0.0004, 0.003, 0.003, 0.07, 2.0, 9.0]
    a = Histogram("a", "", buckets=_GAP)
    b = Histogram("b", "", buckets=_GAP)
    for g in gaps:
        a.observe(g)
    counts = [0] * (len(_GAP) + 1)
    for g in gaps:
        counts[next((i for i, ub in enumerate(_GAP) if g <= ub), len(_GAP))] += 1
    FilterMetrics.add_observations(b, counts, sum(gaps))
    sa = {
        s.name[1:] + str(s.labels): s.value
        for s in a.collect()[0].samples
        if "created" not in s.name
    }
    sb = {
        s.name[1:] + str(s.labels): s.value
        for s in b.collect()[0].samples
        if "created" not in s.name
    }
    assert sa == sb
    with pytest.raises(ValueError):
        FilterMetrics.add_observations(b, counts[:-1], 1.0)


def test_metered_requests_reach_the_pickers_with_their_pool() -> None:
    """On routes Envoy meters, the picker's stream end sees no usage: the cached prompt tokens
    the backend reported come from the access-log entry, with the pool the request went to."""
    from prometheus_client import CollectorRegistry

    from filters.plugins.picker.registry import Pickers

    seen: list[tuple[object, object]] = []
    log = UsageLog(
        FilterMetrics(policy=POLICY),
        lambda: POLICY,
        on_metered=lambda md: seen.append((md.get("pool"), md.get("cached_tokens"))),
    )
    usage = {"prompt_tokens": 31, "completion_tokens": 9, "cached_tokens": 8}
    log.handle(
        als_pb2.StreamAccessLogsMessage(
            http_logs=als_pb2.StreamAccessLogsMessage.HTTPAccessLogEntries(
                log_entry=[
                    entry({**BASE, "pool": "chat", **usage}),
                    entry({**BASE, **usage}),  # no pool named
                    entry({**BASE, "pool": "chat"}),  # no usage reported
                    entry({**BASE, "pool": "chat", **usage, "meter": False}),  # Python's
                ]
            )
        ).SerializeToString()
    )
    assert seen == [("chat", 8.0), (None, 8.0), ("chat", None)]
    registry = CollectorRegistry()
    md = {"meter": True, "pool": "chat", **{k: float(v) for k, v in usage.items()}}
    Pickers(registry=registry).metered("chat", md)  # a pool without a picker: nothing counted
    name = "tokenweir_picker_actual_cached_tokens_total"
    assert registry.get_sample_value(name, {"pool": "chat"}) is None


def test_answer_lengths_reach_the_learned_reservations_once() -> None:
    """On routes Envoy meters, the answers' lengths reach the output-length model from the log;
    an entry the Python usage plugin metered (no ``meter``) was learned at its stream end."""
    from types import SimpleNamespace

    from filters.app import FilterApp
    from filters.output_lengths import OutputLengths

    lengths = OutputLengths(clock=lambda: 0.0)
    settled: list[tuple[object, ...]] = []
    app = SimpleNamespace(  # what FilterApp._metered hands each entry to
        pickers=SimpleNamespace(metered=lambda pool, md: None),
        lengths=lengths,
        gates=SimpleNamespace(settled=lambda *a: settled.append(a)),
    )
    log = UsageLog(
        FilterMetrics(policy=POLICY), lambda: POLICY,
        on_metered=lambda md: FilterApp._metered(app, md),  # type: ignore[arg-type]
    )  # fmt: skip
    usage = {"prompt_tokens": 31, "completion_tokens": 9}
    log.handle(
        als_pb2.StreamAccessLogsMessage(
            http_logs=als_pb2.StreamAccessLogsMessage.HTTPAccessLogEntries(
                log_entry=[
                    entry({**BASE, **usage}),
                    entry({**BASE, **usage, "meter": False}),  # the Python plugin's: not again
                    entry(dict(BASE)),  # no usage reported
                ]
            )
        ).SerializeToString()
    )
    assert lengths.quantile("demo-pro", MODEL, 0.5, 1) == (9, "tenant")
    assert lengths._table[("demo-pro", MODEL)].count == 1
    assert settled == []  # no pool named: no lane share to charge
