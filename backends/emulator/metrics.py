"""Prometheus metrics with SGLang's names (``sglang:``, label ``model_name``), per server.

Each server owns its own ``CollectorRegistry`` (no global state). Gauges are read from the
scheduler at scrape time; counters and histograms are fed by scheduler events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.emulator.request import EmuRequest
from backends.emulator.scheduler import SchedulerStats

__all__ = ["CONTENT_TYPE", "EmulatorMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60)
_ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0,
)  # fmt: skip
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 80, 120, 160, 240, 300)
_QUEUE_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60, 120)


class _GaugeCollector(Collector):
    def __init__(self, model: str, stats: Callable[[], SchedulerStats]) -> None:
        self._model = model
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        values = {
            "num_running_reqs": ("Number of running requests", s.num_running_reqs),
            "num_queue_reqs": ("Number of waiting requests", s.num_queue_reqs),
            "num_used_tokens": ("KV cache tokens in use", s.num_used_tokens),
            "token_usage": ("KV cache usage, 0..1", s.token_usage),
            "max_total_num_tokens": ("KV cache capacity in tokens", s.max_total_num_tokens),
            "gen_throughput": ("Generation throughput, tokens/s", s.gen_throughput),
            "cache_hit_rate": ("Prefix cache hit rate of prompt tokens", s.cache_hit_rate),
        }
        for name, (doc, value) in values.items():
            g = GaugeMetricFamily(f"sglang:{name}", doc, labels=["model_name"])
            g.add_metric([self._model], float(value))
            yield g


class EmulatorMetrics:
    """The scheduler's observer, and the ``/metrics`` text."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels = self.registry, ["model_name"]

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"sglang:{name}", doc, labels, registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"sglang:{name}", doc, labels, registry=r, buckets=buckets)

        self._prompt = counter("prompt_tokens_total", "Prompt tokens processed").labels(model)
        self._gen = counter("generation_tokens_total", "Generated tokens").labels(model)
        self._cached = counter("cached_tokens_total", "Prompt tokens served from cache").labels(
            model
        )
        self._requests = counter("num_requests_total", "Finished requests").labels(model)
        self._aborted = counter("num_aborted_requests_total", "Aborted requests").labels(model)
        self._ttft = hist("time_to_first_token_seconds", "TTFT", _TTFT_BUCKETS).labels(model)
        self._itl = hist("inter_token_latency_seconds", "ITL", _ITL_BUCKETS).labels(model)
        self._e2e = hist("e2e_request_latency_seconds", "E2E latency", _E2E_BUCKETS).labels(model)
        self._queue = hist("queue_time_seconds", "Time waiting", _QUEUE_BUCKETS).labels(model)
        self._gauges: _GaugeCollector | None = None

    def bind(self, stats: Callable[[], SchedulerStats]) -> None:
        """Read gauges from ``stats`` at scrape time."""
        if self._gauges is None:
            self._gauges = _GaugeCollector(self.model, stats)
            self.registry.register(self._gauges)

    # ---- SchedulerObserver ---------------------------------------------------------------
    def on_admit(self, req: EmuRequest, queue_time_s: float) -> None:
        self._queue.observe(queue_time_s)
        self._prompt.inc(req.prompt_len)
        if req.cached_tokens:
            self._cached.inc(req.cached_tokens)

    def on_first_token(self, req: EmuRequest, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)

    def on_decode(self, tokens: int, itls_s: list[float]) -> None:
        self._gen.inc(tokens)
        observe = self._itl.observe
        for v in itls_s:
            observe(v)

    def on_finish(self, req: EmuRequest, e2e_s: float) -> None:
        if req.finish_reason == "abort":
            self._aborted.inc()
            return
        self._requests.inc()
        self._e2e.observe(e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
