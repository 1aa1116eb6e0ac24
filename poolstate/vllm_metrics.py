"""Read a vLLM server's ``/metrics`` into the same :class:`ReplicaSample` SGLang's give.

Names from vLLM's source (``vllm/v1/metrics/loggers.py``; labels ``model_name``, ``engine``: one
series per engine core with data parallelism, summed or averaged like SGLang's ranks):

=========================================  ===============================================
vLLM                                        read as
=========================================  ===============================================
``vllm:num_requests_running``               running (sum)
``vllm:num_requests_waiting``               queued (sum)
``vllm:kv_cache_usage_perc`` (0..1; older   token_usage (largest); the newer name wins
``vllm:gpu_cache_usage_perc``)
``vllm:cache_config_info`` labels           max_total_tokens = ``num_gpu_blocks`` x ``block_size``
``num_gpu_blocks``, ``block_size``          (sum over engines); used_tokens = usage x that
``vllm:prefix_cache_hits_total`` /          cache_hit_rate (since the server started; older
``vllm:prefix_cache_queries_total``         ``vllm:gpu_prefix_cache_*``; ``vllm:gpu_prefix_
                                            cache_hit_rate`` gauge of vLLM v0)
=========================================  ===============================================

vLLM has no generation-throughput gauge (``gen_throughput`` stays None) and does not export
``--max-num-seqs``: the pool's ``capacity.max_running_requests`` says it (policy/
backend.py). Like the SGLang reader, only the sample lines of these names are parsed.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from poolstate.errors import MetricsTextError
from poolstate.metrics_text import ReplicaSample, parse_metrics_text

__all__ = ["VLLM_SERIES", "parse_backend_metrics", "parse_vllm_metrics_text"]

VLLM_SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hit_rate",
)
_LINE = re.compile(
    "^(?:" + "|".join(re.escape(g) for g in VLLM_SERIES) + r")(?:\{[^\n]*\})?[ \t][^\n]*$", re.M
)


def _samples(text: str) -> tuple[dict[str, list[float]], list[dict[str, str]]]:
    """Values per series name, and the label sets of ``vllm:cache_config_info``."""
    values: dict[str, list[float]] = {}
    configs: list[dict[str, str]] = []
    body = "\n".join(_LINE.findall(text)) + "\n"
    try:
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == "vllm:cache_config_info":
                    configs.append(dict(sample.labels))
                elif sample.name in VLLM_SERIES and sample.value == sample.value:
                    values.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsTextError(f"not Prometheus text exposition: {exc}") from exc
    return values, configs


def _capacity_tokens(configs: list[dict[str, str]]) -> int | None:
    total = 0
    for labels in configs:
        try:
            total += int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):  # "None" before the engine profiled its memory
            continue
    return total or None


def parse_vllm_metrics_text(text: str) -> ReplicaSample:
    """Pure: vLLM's load gauges in ``text``; MetricsTextError when it is not exposition."""
    values, configs = _samples(text)

    def total(*names: str) -> int | None:
        for name in names:
            if values.get(name):
                return int(sum(values[name]))
        return None

    def largest(*names: str) -> float | None:
        for name in names:
            if values.get(name):
                return max(values[name])
        return None

    usage = largest("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    capacity = _capacity_tokens(configs)
    hit_rate: float | None = None
    for hits, queries in (
        ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
        ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
    ):
        if values.get(queries):
            asked = sum(values[queries])
            hit_rate = sum(values.get(hits, [])) / asked if asked > 0 else 0.0
            break
    else:
        rates = values.get("vllm:gpu_prefix_cache_hit_rate")
        hit_rate = sum(rates) / len(rates) if rates else None
    return ReplicaSample(
        running=total("vllm:num_requests_running"),
        queued=total("vllm:num_requests_waiting"),
        used_tokens=round(usage * capacity) if usage is not None and capacity else None,
        token_usage=usage,
        gen_throughput=None,
        cache_hit_rate=hit_rate,
        max_total_tokens=capacity,
    )


def parse_backend_metrics(text: str, backend: str) -> ReplicaSample:
    """The reader of ``backend``'s metric names (``sglang`` or ``vllm``)."""
    return parse_vllm_metrics_text(text) if backend == "vllm" else parse_metrics_text(text)
