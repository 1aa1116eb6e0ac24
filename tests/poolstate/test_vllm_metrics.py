"""vLLM's /metrics read into the pool state's sample (poolstate/vllm_metrics.py)."""

from __future__ import annotations

import pytest

from poolstate import MetricsTextError, parse_backend_metrics
from poolstate.vllm_metrics import parse_vllm_metrics_text

NEW = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 800.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
"""

OLD = """\
vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.4
vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0
"""


def test_newer_names_summed_over_engines() -> None:
    s = parse_backend_metrics(NEW, "vllm")
    assert (s.running, s.queued, s.token_usage) == (5, 4, 0.5)
    assert s.max_total_tokens == 32_000 and s.used_tokens == 16_000
    assert s.cache_hit_rate == pytest.approx(0.25)
    assert s.gen_throughput is None and s.complete


def test_older_names_and_a_cache_not_yet_profiled() -> None:
    s = parse_vllm_metrics_text(OLD)
    assert (s.running, s.queued, s.token_usage, s.cache_hit_rate) == (1, 0, 0.75, 0.4)
    assert s.max_total_tokens is None and s.used_tokens is None


def test_sglang_names_are_not_vllm_ones() -> None:
    sglang = 'sglang:num_running_reqs{model_name="m"} 1\nsglang:num_queue_reqs{model_name="m"} 0\n'
    assert not parse_backend_metrics(sglang, "vllm").complete
    assert parse_backend_metrics(sglang, "sglang").complete
    assert not parse_backend_metrics(NEW, "sglang").complete


def test_not_exposition_is_an_error() -> None:
    with pytest.raises(MetricsTextError):
        parse_vllm_metrics_text('vllm:num_requests_running{model_name="m"} lots\n')
