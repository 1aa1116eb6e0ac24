"""Parsing SGLang's /metrics text: the load gauges, several series, garbage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.emulator.metrics import EmulatorMetrics
from backends.emulator.scheduler import SchedulerStats
from poolstate import MetricsTextError, ReplicaSample, parse_metrics_text

SGLANG_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B"} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B"} 0.42
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="meta-llama/Llama-3.1-8B"} 1534.5
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B"} 0.37
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B"} 81234.0
"""


def test_reads_the_load_gauges_of_an_sglang_text() -> None:
    s = parse_metrics_text(SGLANG_TEXT)
    assert s == ReplicaSample(
        running=12, queued=3, token_usage=0.42, gen_throughput=1534.5, cache_hit_rate=0.37
    )
    assert s.complete


def test_sums_counts_over_data_parallel_series_and_takes_the_largest_kv_usage() -> None:
    text = (
        'sglang:num_running_reqs{model_name="m",dp_rank="0"} 4\n'
        'sglang:num_running_reqs{model_name="m",dp_rank="1"} 6\n'
        'sglang:num_queue_reqs{model_name="m",dp_rank="0"} 1\n'
        'sglang:num_queue_reqs{model_name="m",dp_rank="1"} 2\n'
        'sglang:token_usage{model_name="m",dp_rank="0"} 0.2\n'
        'sglang:token_usage{model_name="m",dp_rank="1"} 0.7\n'
    )
    s = parse_metrics_text(text)
    assert (s.running, s.queued, s.token_usage) == (10, 3, 0.7)


def test_the_emulators_own_metrics_parse() -> None:
    m = EmulatorMetrics("emulated-model")
    m.bind(
        lambda: SchedulerStats(
            num_running_reqs=5,
            num_queue_reqs=2,
            num_used_tokens=1000,
            max_total_num_tokens=4000,
            token_usage=0.25,
            cache_hit_rate=0.5,
            gen_throughput=99.0,
            cached_tokens_in_tree=10,
        )
    )
    s = parse_metrics_text(m.render().decode())
    assert (s.running, s.queued, s.used_tokens, s.max_total_tokens) == (5, 2, 1000, 4000)
    assert s.token_usage == 0.25 and s.gen_throughput == 99.0


def test_a_text_without_the_gauges_is_incomplete() -> None:
    s = parse_metrics_text("# TYPE other gauge\nother 1\n")
    assert s == ReplicaSample() and not s.complete


@pytest.mark.parametrize(
    "text",
    ['sglang:num_queue_reqs{model_name="m"} lots\n', 'sglang:num_running_reqs{model_name=="m} 1\n'],
)
def test_a_broken_gauge_line_raises_a_metrics_text_error(text: str) -> None:
    with pytest.raises(MetricsTextError):
        parse_metrics_text(text)


def test_lines_the_signal_does_not_read_are_not_parsed() -> None:
    s = parse_metrics_text("{{{ not metrics\n" + SGLANG_TEXT + "other_metric{ 1 2 3\n")
    assert (s.running, s.queued) == (12, 3)


@given(st.text(max_size=200))
def test_any_text_parses_or_raises_metrics_text_error(text: str) -> None:
    try:
        s = parse_metrics_text(text)
    except MetricsTextError:
        return
    assert isinstance(s, ReplicaSample)
