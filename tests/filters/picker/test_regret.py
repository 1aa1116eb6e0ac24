"""Routing regret: the picker's predictions beside what each request saw, by pool and replica,
from either meter (the Python usage plugin's stream end, or Envoy's access log entry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from filters.plugins.picker.latency import LatencyModel
from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.regret import Routed, from_log, observe, step_of

R = "127.0.0.1:7001"


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, {"pool": "chat", "replica": R, **labels}) or 0.0


def test_cached_tokens_error_is_signed_and_relative_to_the_prompt() -> None:
    reg = CollectorRegistry()
    metrics, model = PickerMetrics(reg), LatencyModel()
    common = {"prompt_tokens": 1000, "work": 0, "predicted_ttft": None, "ttft": None}
    observe(metrics, model, "chat", R, predicted_cached=900, actual_cached=300, **common)  # -0.6
    observe(metrics, model, "chat", R, predicted_cached=500, actual_cached=510, **common)  # +0.01
    name = "tokenweir_picker_cached_prediction_error_bucket"
    assert _value(reg, name, le="-0.5") == 1  # over-promised by 60% of the prompt
    assert _value(reg, name, le="0.02") - _value(reg, name, le="-0.02") == 1
    # no usage reported: nothing to compare
    observe(metrics, model, "chat", R, predicted_cached=5, actual_cached=None, **common)
    assert _value(reg, "tokenweir_picker_cached_prediction_error_count") == 2


def test_ttft_is_compared_once_learned_and_always_teaches_the_model() -> None:
    reg = CollectorRegistry()
    metrics, model = PickerMetrics(reg), LatencyModel(min_count=4)
    for i in range(4):
        assert model.predict(R, 1000) is None
        observe(
            metrics, model, "chat", R, predicted_cached=0, actual_cached=0, prompt_tokens=10,
            work=1000 * (i + 1), predicted_ttft=None, ttft=0.01 + 0.05 * (i + 1),
        )  # fmt: skip
    assert _value(reg, "tokenweir_picker_ttft_ratio_count") == 0
    predicted = model.predict(R, 2000)
    assert predicted is not None and abs(predicted - 0.11) < 0.01
    observe(
        metrics, model, "chat", R, predicted_cached=0, actual_cached=0, prompt_tokens=10,
        work=2000, predicted_ttft=predicted, ttft=2 * predicted,
    )  # fmt: skip
    assert _value(reg, "tokenweir_picker_ttft_ratio_count") == 1
    assert _value(reg, "tokenweir_picker_ttft_ratio_bucket", le="1.5") == 0
    assert _value(reg, "tokenweir_picker_ttft_ratio_bucket", le="2.0") == 1


def test_the_access_log_brings_back_what_the_pick_set() -> None:
    routed = Routed(R, uncached=40, lead=None, predicted_cached=600, work=900, predicted_ttft=0.05)
    md: dict[str, object] = {
        k: float(v) if isinstance(v, int) else v for k, v in routed.metadata(100.0).items()
    }
    assert md["predicted_ttft_ms"] == 50.0 and md["sent_us"] == 100_000_000.0
    # the meter's timing: chunks, first_us, last_us, ... (wall clock, like sent_us)
    md.update(timing="3,100080000,100120000,0", prompt_tokens=700.0, completion_tokens=5.0,
              cached_tokens=640.0)  # fmt: skip
    facts = from_log(md)
    assert facts is not None
    assert facts["replica"] == R and facts["predicted_cached"] == 600
    assert facts["actual_cached"] == 640 and facts["prompt_tokens"] == 700
    assert facts["work"] == 900 and facts["predicted_ttft"] == 0.05
    assert abs(facts["ttft"] - 0.08) < 1e-9
    # a request the picker did not place (ring hash decided)
    assert from_log({"pool": "chat", "timing": "1,5,5,0"}) is None
    # no usage reported: the cache cannot be compared, the first chunk still times it
    del md["completion_tokens"], md["cached_tokens"]
    facts = from_log(md)
    assert facts is not None and facts["actual_cached"] is None and facts["ttft"] is not None
    # no answer at all: no ttft
    md["timing"] = "0,0,0,0"
    facts = from_log(md)
    assert facts is not None and facts["ttft"] is None


async def test_the_plugin_predicts_at_the_pick_and_learns_at_the_stream_end() -> None:
    """The Python meter's path: the picker's stream end reads the usage and the first token's
    time the usage plugin left on the context."""
    import json
    from types import SimpleNamespace

    from filters.api import Context, RouteInfo, Usage
    from filters.plugins.picker.plugin import PickerPlugin
    from filters.plugins.picker.registry import Pickers
    from tests.filters.picker.test_pool import NAMES, Clock, _picker

    clock = Clock()
    picker, _ = _picker(clock)
    pickers = Pickers(registry=CollectorRegistry(), clock=clock, wall=clock)
    picker.metrics = pickers.metrics
    pickers._pools["chat"] = (None, picker)
    plugin = PickerPlugin({}, SimpleNamespace(pickers=pickers))  # type: ignore[arg-type]
    body = json.dumps({"text": "hello " * 200, "sampling_params": {"max_new_tokens": 2}})
    for i in range(10):
        ctx = Context(route=RouteInfo(name="r", pool="chat"), started=clock(), path="/generate")
        result = await plugin.request_body(ctx, body.encode())
        assert result is not None
        md = result.metadata
        assert md["replica"] in NAMES and md["work_tokens"] >= 0
        assert ("predicted_ttft_ms" in md) == (i >= 8)  # learned after min_count requests
        clock.now += 0.25
        ctx.first_token_at = clock()
        ctx.usage = Usage(prompt_tokens=400, completion_tokens=2, cached_tokens=0)
        await plugin.stream_end(ctx)
    total = sum(
        s.value
        for m in pickers.metrics.ttft_ratio.collect()
        for s in m.samples
        if s.name.endswith("_count")
    )
    assert total == 2  # the 9th and 10th were predicted, then compared
    errors = sum(
        s.value
        for m in pickers.metrics.cached_error.collect()
        for s in m.samples
        if s.name.endswith("_count")
    )
    assert errors == 10


def test_the_access_log_brings_back_the_batch_and_the_decode_step() -> None:
    routed = Routed(R, uncached=0, lead=None, predicted_cached=0, running=3)
    md: dict[str, object] = {
        k: float(v) if isinstance(v, int) else v for k, v in routed.metadata(100.0).items()
    }
    # 5 tokens: the first at +80 ms, the last at +120 ms: 10 ms per token after the first
    md.update(timing="5,100080000,100120000,0", prompt_tokens=70.0, completion_tokens=5.0)
    facts = from_log(md)
    assert facts is not None and facts["running"] == 3
    assert abs(facts["step"] - 0.01) < 1e-9
    md["completion_tokens"] = 1.0  # one token: no step
    assert (from_log(md) or {})["step"] is None
    assert step_of(1.0, 1.0, 5) is None and step_of(1.0, 1.5, 6) == 0.1


def test_decode_steps_teach_the_model_its_step_against_the_batch() -> None:
    metrics, model = PickerMetrics(CollectorRegistry()), LatencyModel(min_count=4)
    assert model.step(R, 4) is None
    for running in (1, 2, 4, 8, 1, 2, 4, 8):  # step = 10 ms + 2 ms per request in the batch
        observe(
            metrics, model, "chat", R, predicted_cached=0, actual_cached=0, prompt_tokens=10,
            work=0, predicted_ttft=None, ttft=0.05, running=running, step=0.01 + 0.002 * running,
        )  # fmt: skip
    got = model.step(R, 6)
    assert got is not None and abs(got - 0.022) < 0.002
    assert model.rates(R, 6).step_s == got
