"""Counters → live demand: arrival rate without the service-time lag, token means, hit ratio,
trend, restarts and new replicas."""

from __future__ import annotations

import pytest

from controlplane.autoscale import DemandWindow, ReplicaCounters, parse_counters
from poolstate.valley import RunnerWord

PAGE = """# HELP sglang:num_requests_total Finished requests
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="m"} 10.0
sglang:prompt_tokens_total{model_name="m"} 5000.0
sglang:generation_tokens_total{model_name="m"} 1200.0
sglang:cached_tokens_total{model_name="m"} 1000.0
sglang:num_running_reqs{model_name="m"} 3.0
sglang:num_queue_reqs{model_name="m"} 1.0
sglang:num_requests_created 17.0
"""


def test_parse_counters_sums_label_sets_and_ignores_others() -> None:
    c = parse_counters(PAGE + 'sglang:num_requests_total{model_name="n"} 2\n')
    assert c == ReplicaCounters(12.0, 5000.0, 1200.0, 1000.0, 3.0, 1.0)
    assert c.inflight == 4.0
    assert parse_counters("up 1\n") is None


# a vLLM page as its loggers write it: two engines, finish reasons as label sets, the prefix
# cache counted under the old name and the new, and the token-gap histogram under both names
VLLM_PAGE = """vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 3.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9
vllm:prompt_tokens_total{engine="0",model_name="m"} 5000.0
vllm:generation_tokens_total{engine="0",model_name="m"} 1200.0
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1000.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 4.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 400.0
vllm:time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.5
vllm:time_per_output_token_seconds_count{engine="0",model_name="m"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.2
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 12.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.3
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 12.0
"""


def test_a_vllm_page_gives_the_same_counters_each_counted_once() -> None:
    c = parse_counters(VLLM_PAGE)
    assert c == ReplicaCounters(
        12.0, 5000.0, 1200.0, 1000.0, 3.0, 1.0, 4.0, 400.0, 1.2, 12.0, 0.3, 12.0
    )  # the cache hits once (not old + new), the token gaps from the newer histogram
    older = "\n".join(
        line
        for line in VLLM_PAGE.splitlines()
        if not line.startswith(("vllm:inter_token", "vllm:prefix_cache_hits"))
    )  # a vLLM before the renames: its per-token histogram and the gpu_ counters
    c = parse_counters(older)
    assert c is not None
    assert (c.cached, c.itl_sum, c.itl_count) == (1000.0, 0.5, 12.0)


def _c(finished: float, inflight: float = 0, prompt: float = 0, gen: float = 0, cached: float = 0):
    return ReplicaCounters(finished, prompt, gen, cached, inflight, 0.0)


def test_arrivals_count_in_flight_requests_and_token_means() -> None:
    w = DemandWindow(10.0)
    w.observe(0.0, {"a": _c(0)})
    # 4 arrived in 2 s: 1 finished (100 prompt + 50 out), 3 in flight (300 prompt, 10 out each)
    w.observe(2.0, {"a": _c(1, 3, prompt=400, gen=80, cached=100)})  # 50 + 3 × 10 in flight
    d = w.demand()
    assert d.arrival_rps == pytest.approx(2.0)
    assert d.prompt_mean == pytest.approx(100.0)
    assert d.output_mean == pytest.approx(80 / 4)
    assert d.hit_rate == pytest.approx(0.25)
    assert d.inflight == 3 and d.measured


def test_a_restarted_or_new_replica_adds_nothing_that_round() -> None:
    w = DemandWindow(10.0)
    w.observe(0.0, {"a": _c(100, prompt=1000)})
    w.observe(1.0, {"a": _c(1, prompt=10), "b": _c(50, prompt=500)})  # a restarted, b is new
    w.observe(2.0, {"a": _c(3, prompt=30), "b": _c(52, prompt=520)})
    assert w.demand().arrival_rps == pytest.approx(4 / 2)


def test_the_window_slides_and_a_ramp_has_a_positive_trend() -> None:
    w = DemandWindow(4.0)
    total = 0.0
    for t in range(0, 21):
        total += 10 * t  # the rate grows by 10 req/s each second
        w.observe(float(t), {"a": _c(total)})
    d = w.demand()
    assert d.span_s == pytest.approx(4.0)
    assert d.arrival_rps == pytest.approx(185.0)  # (170+180+190+200)/4
    # halves of 2 s: 370 and 390 requests; 20 less 2·√760 = 55 of noise: no trend taken
    assert d.trend_rps_per_s == 0.0
    w = DemandWindow(20.0)
    total = 0.0
    for t in range(0, 41):
        total += 10 * t
        w.observe(float(t), {"a": _c(total)})
    d = w.demand()  # a long window: the ramp stands out of the noise, shrunk by it
    assert 7.0 < d.trend_rps_per_s < 10.0
    assert d.forecast_rps(10.0) == pytest.approx(d.arrival_rps + 10 * d.trend_rps_per_s)


def test_a_falling_rate_never_forecasts_below_now() -> None:
    w = DemandWindow(6.0)
    total = 0.0
    for t in range(0, 7):
        total += 100 * (10 - t)
        w.observe(float(t), {"a": _c(total)})
    d = w.demand()
    assert d.trend_rps_per_s < 0
    assert d.forecast_rps(30.0) == d.arrival_rps


def test_a_trend_waits_for_a_full_window_and_nothing_finished_is_not_measured() -> None:
    w = DemandWindow(10.0)
    for t in range(0, 5):
        w.observe(float(t), {"a": _c(0, inflight=t * t)})
    d = w.demand()
    assert d.trend_rps_per_s == 0.0 and not d.measured


def test_tokens_of_streams_in_flight_do_not_inflate_the_output_mean() -> None:
    w = DemandWindow(10.0)
    w.observe(0.0, {"a": _c(0)})
    # 1 finished (24 tokens) while 9 more arrived and already streamed 20 tokens each
    w.observe(2.0, {"a": _c(1, 9, prompt=200, gen=24 + 9 * 20)})
    assert w.demand().output_mean == pytest.approx(204 / 10)  # not 204 per finished request


def test_a_batch_runners_lines_are_not_demand() -> None:
    """A runner fills whatever slots it finds (poolstate/valley.py): planned for, its lines
    asked for more replicas, then filled them. Its word (lines at the replicas, lines answered
    and their tokens) is taken off the replicas' counters."""
    w = DemandWindow(10.0)
    # interactive: 2 req/s of 100-token prompts and 20-token answers, 2 in flight; the
    # runner: 20 lines/s of 500 and 50, 40 lines at the replicas
    for t in range(0, 11):
        inter_done, lines_done = 2 * t, 20 * t
        replica = _c(
            inter_done + lines_done,
            prompt=100 * inter_done + 500 * lines_done,
            gen=20 * inter_done + 50 * lines_done,
            inflight=2 + 40,
        )
        runner = RunnerWord(40, 0.0, lines_done, 500 * lines_done, 50 * lines_done)
        w.observe(float(t), {"a": replica}, {"runner-0": runner})
    d = w.demand()
    assert d.arrival_rps == pytest.approx(2.0)
    assert d.prompt_mean == pytest.approx(100.0) and d.output_mean == pytest.approx(20.0)
    assert d.inflight == 2 and d.runner_share == pytest.approx(20 / 22)
    # without the runners' word the same pool reads 11x the demand
    plain = DemandWindow(10.0)
    for t in range(0, 11):
        n = 22 * t
        plain.observe(float(t), {"a": _c(n, prompt=100 * 2 * t + 500 * 20 * t, inflight=42)})
    assert plain.demand().arrival_rps == pytest.approx(22.0)


def test_a_runners_word_ahead_of_the_replicas_page_counts_its_lines_once() -> None:
    """Read at different moments: a round in which the runner says 10 new lines that the
    replica's page does not show yet, then the page catches up. The pool's net arrivals stay
    what the replica saw of others (never below what they were, never counted twice)."""
    w = DemandWindow(10.0)
    w.observe(0.0, {"a": _c(0, inflight=0)}, {"r": RunnerWord(0, 0.0)})
    w.observe(1.0, {"a": _c(1, inflight=0)}, {"r": RunnerWord(10, 0.0)})  # ahead
    w.observe(2.0, {"a": _c(2, inflight=10)}, {"r": RunnerWord(10, 0.0)})  # caught up
    w.observe(3.0, {"a": _c(13, inflight=0)}, {"r": RunnerWord(0, 0.0, 10)})  # answered
    d = w.demand()
    assert d.arrival_rps == pytest.approx(3 / 3)  # 1 a second of others' requests
    assert d.inflight == 0
    # a runner that restarted (its counts went down) adds nothing that round
    w.observe(4.0, {"a": _c(14, inflight=0)}, {"r": RunnerWord(0, 0.0, 0)})
    assert w.demand().arrival_rps == pytest.approx(4 / 4)
