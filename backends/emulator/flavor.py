"""``--flavor vllm``: the emulator presents itself as a vLLM OpenAI server.

What changes against the SGLang flavour (the scheduler, radix cache and timing stay the same):

- **Endpoints**: vLLM's ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``,
  ``/health`` (200, empty body) and ``/metrics``; none of SGLang's native ones (``/generate``,
  ``/get_server_info``, ``/flush_cache`` ...: 404). The emulator's own ``/_emulator/*`` stay, for
  tests.
- **Metrics** (:class:`VllmMetrics`): vLLM's names (``vllm/v1/metrics/loggers.py``, labels
  ``model_name`` and ``engine``): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc``, ``vllm:cache_config_info`` (labels ``block_size``,
  ``num_gpu_blocks``), counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``
  (tokens), ``vllm:prompt_tokens``, ``vllm:generation_tokens``, ``vllm:request_success``,
  histograms ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` (every
  token gap, as newer vLLM; older ones observed them as ``vllm:time_per_output_token_seconds``),
  ``vllm:request_queue_time_seconds`` (the WAITING phase), ``vllm:e2e_request_latency_seconds``.
- **KV events** (:class:`VllmEventEncoder`): newer vLLM's shape (msgpack maps, events tagged
  ``"type"``, ``medium``, ``lora_name``, ``data_parallel_rank``), block hashes as 32 raw bytes
  chained from a seed drawn per process (as vLLM does without ``PYTHONHASHSEED``), so a consumer
  cannot take them for prompt hashes; no ``AllBlocksCleared`` at start (vLLM sends it only when
  its prefix cache is reset).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.emulator.request import EmuRequest
from backends.emulator.scheduler import SchedulerStats
from prefixindex.vllm_wire import (
    VllmAllBlocksCleared,
    VllmBlockRemoved,
    VllmBlockStored,
    VllmEventBatch,
    encode_vllm_batch,
)
from prefixindex.wire import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

__all__ = ["FLAVORS", "VLLM_NATIVE_PATHS", "VllmEventEncoder", "VllmMetrics"]

FLAVORS = ("sglang", "vllm")
# the emulator's native routes a vLLM server also has (the rest answer 404)
VLLM_NATIVE_PATHS = frozenset({"/health", "/metrics"})

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


class _VllmGauges(Collector):
    def __init__(self, model: str, page_size: int, stats: Callable[[], SchedulerStats]) -> None:
        self._labels = [model, "0"]
        self._page_size = page_size
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        names = ["model_name", "engine"]
        for name, doc, value in (
            ("num_requests_running", "Number of requests in model execution batches.",
             s.num_running_reqs),
            ("num_requests_waiting", "Number of requests waiting to be processed.",
             s.num_queue_reqs),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.token_usage),
        ):  # fmt: skip
            g = GaugeMetricFamily(f"vllm:{name}", doc, labels=names)
            g.add_metric(self._labels, float(value))
            yield g
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"],
        )
        blocks = s.max_total_num_tokens // self._page_size
        info.add_metric([str(self._page_size), str(blocks), "True", "0"], 1.0)
        yield info


class VllmMetrics:
    """The scheduler's observer with vLLM's metric names, and the ``/metrics`` text."""

    def __init__(self, model: str, page_size: int) -> None:
        self.model = model
        self.page_size = page_size
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels, values = self.registry, ["model_name", "engine"], (model, "0")

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"vllm:{name}", doc, labels, registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"vllm:{name}", doc, labels, registry=r, buckets=buckets)

        self._queries = counter("prefix_cache_queries", "Prefix cache queries (tokens).").labels(
            *values
        )
        self._hits = counter("prefix_cache_hits", "Prefix cache hits (tokens).").labels(*values)
        self._prompt = counter("prompt_tokens", "Number of prefill tokens processed.").labels(
            *values
        )
        self._gen = counter("generation_tokens", "Number of generation tokens.").labels(*values)
        self._success = counter("request_success", "Count of successfully processed requests.")
        self._ok = self._success.labels(*values)
        self._ttft = hist("time_to_first_token_seconds", "TTFT", _TTFT_BUCKETS).labels(*values)
        self._itl = hist("inter_token_latency_seconds", "ITL", _ITL_BUCKETS).labels(*values)
        self._queue = hist("request_queue_time_seconds", "WAITING", _E2E_BUCKETS).labels(*values)
        self._e2e = hist("e2e_request_latency_seconds", "E2E", _E2E_BUCKETS).labels(*values)
        self._gauges: _VllmGauges | None = None

    def bind(self, stats: Callable[[], SchedulerStats]) -> None:
        if self._gauges is None:
            self._gauges = _VllmGauges(self.model, self.page_size, stats)
            self.registry.register(self._gauges)

    def on_admit(self, req: EmuRequest, queue_time_s: float) -> None:
        self._queue.observe(queue_time_s)
        self._queries.inc(req.prompt_len)
        self._prompt.inc(req.prompt_len)
        if req.cached_tokens:
            self._hits.inc(req.cached_tokens)

    def on_first_token(self, req: EmuRequest, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)

    def on_decode(self, tokens: int, itls_s: list[float]) -> None:
        self._gen.inc(tokens)
        observe = self._itl.observe
        for v in itls_s:
            observe(v)

    def on_finish(self, req: EmuRequest, e2e_s: float) -> None:
        if req.finish_reason != "abort":
            self._ok.inc()
            self._e2e.observe(e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class VllmEventEncoder:
    """Turns the radix cache's (SGLang-shaped) events into vLLM's payload: block hashes
    rewritten into a per-process seeded chain, the fields and map encoding of newer vLLM."""

    def __init__(self, seed: bytes | None = None) -> None:
        self._seed = seed if seed is not None else os.urandom(32)  # vLLM's NONE_HASH
        self._hashes: dict[int, bytes] = {}  # the radix cache's block id → vLLM's hash
        self._started = False

    def __call__(self, ts: float, events: list[KvEvent]) -> bytes | None:
        out: list[VllmBlockStored | VllmBlockRemoved | VllmAllBlocksCleared] = []
        for e in events:
            if isinstance(e, BlockStored):
                out.append(self._stored(e))
            elif isinstance(e, BlockRemoved):
                gone = [self._hashes.pop(h) for h in e.block_hashes if h in self._hashes]
                out.append(VllmBlockRemoved(block_hashes=list(gone), medium=e.medium))
            elif isinstance(e, AllBlocksCleared):
                self._hashes.clear()
                if self._started:  # not the fresh cache's: vLLM does not announce that one
                    out.append(VllmAllBlocksCleared())
        self._started = True
        if not out:
            return None
        return encode_vllm_batch(VllmEventBatch(ts=ts, events=out, data_parallel_rank=0))

    def _stored(self, e: BlockStored) -> VllmBlockStored:
        parent = self._hashes.get(e.parent_block_hash) if e.parent_block_hash is not None else None
        prior = parent if parent is not None else self._seed
        size, hashes = e.block_size, []
        for i, ours in enumerate(e.block_hashes):
            block = e.token_ids[i * size : (i + 1) * size]
            digest = hashlib.sha256(prior + repr(tuple(block)).encode()).digest()
            self._hashes[ours] = digest
            hashes.append(digest)
            prior = digest
        return VllmBlockStored(
            block_hashes=list(hashes),
            parent_block_hash=parent,
            token_ids=list(e.token_ids[: len(hashes) * size]),  # whole blocks only, as vLLM
            block_size=size,
            lora_id=None,
            medium=e.medium,
            lora_name=None,
        )
