"""Typed settings of one emulator process (entry points build them; nothing reads the environment)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from backends.emulator.disagg_config import DisaggConfig
from backends.emulator.lora_config import LoraConfig
from backends.emulator.priority import PriorityConfig
from backends.profiles import BackendProfile, get_profile
from prefixindex.wire import KvEventsConfig

__all__ = ["EmulatorSettings"]


@dataclass(frozen=True, slots=True)
class EmulatorSettings:
    """Everything ``start_emulator`` needs. ``None`` overrides keep the profile's value."""

    model: str = "emulated-model"
    profile: str = "llama-3.1-8b-h100"
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port chosen by the OS
    time_scale: float = 1.0  # emulated durations are multiplied by this (0.01 = 100x faster)
    seed: int = 0
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    cache_tokens: int | None = None  # KV pool / radix cache capacity in tokens
    page_size: int | None = None
    chunked_prefill_size: int | None = None
    context_length: int | None = None
    embedding_dim: int = (
        256  # --embedding-dim: floats per /v1/embeddings vector (embeddings_api.py)
    )
    default_max_tokens: int = 128  # when a request names no max_tokens / max_new_tokens
    stop_prob: float = 0.0  # per-token chance of an EOS (unless ignore_eos)
    enable_cache_report: bool = True  # usage.prompt_tokens_details.cached_tokens
    error_rate: float = 0.0
    hang_rate: float = 0.0
    slow_factor: float = 1.0
    slow_start_s: float = 0.0
    exit_on_crash: bool = False  # the process exits on a crash fault (set by __main__)
    enable_trace: bool = False  # --enable-trace: OTLP spans per request (as SGLang)
    otlp_traces_endpoint: str = "localhost:4317"  # --otlp-traces-endpoint (gRPC)
    kv_events: KvEventsConfig | None = None  # --kv-events-config (publisher "zmq" turns it on)
    # --disconnect-check: seconds between checks for a gone client of a non-streamed request
    # (SGLang's HTTP server looks every 4 s and aborts then: a request that ends before the
    # next look runs to its end). 0: the moment the connection closes
    disconnect_check: float = 0.0
    request_log: str | None = (
        None  # --request-log: a JSON line per finished request (request_log.py)
    )
    # --tokenizer-path: a model directory (tokenizer.json, its chat template): prompts are
    # rendered and tokenized as SGLang does for that model, so KV events carry its token ids
    tokenizer_path: str | None = None
    # --enable-priority-scheduling, --schedule-low-priority-values-first, ... (SGLang)
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    # --flavor: which server it presents itself as, "sglang" or "vllm" (backends/emulator/flavor.py)
    flavor: str = "sglang"
    # --disaggregation-mode prefill|decode, --disaggregation-bootstrap-port, ... (disagg.py)
    disaggregation: DisaggConfig = field(default_factory=DisaggConfig)
    # --enable-lora, --lora-paths, --max-loras-per-batch, --max-loaded-loras (lora.py)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        if self.flavor not in ("sglang", "vllm"):
            raise ValueError(f"flavor: {self.flavor!r} is not allowed; allowed: sglang, vllm")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port out of range: {self.port}")
        for key in ("error_rate", "hang_rate", "stop_prob"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} must be within [0, 1], got {value}")
        if self.slow_factor < 1.0:
            raise ValueError(f"slow_factor must be >= 1, got {self.slow_factor}")
        if self.slow_start_s < 0:
            raise ValueError(f"slow_start_s must be >= 0, got {self.slow_start_s}")
        if not 1 <= self.embedding_dim <= 65536:
            raise ValueError(f"embedding_dim must be from 1 to 65536, got {self.embedding_dim}")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        self.resolved_profile()  # unknown names and bad overrides fail here

    def resolved_profile(self) -> BackendProfile:
        """The named profile with this process's overrides applied."""
        base = get_profile(self.profile)
        overrides = (
            self.max_running_requests, self.max_queued_requests, self.cache_tokens,
            self.page_size, self.chunked_prefill_size, self.context_length,
        )  # fmt: skip
        if all(v is None for v in overrides):
            return base

        def pick(override: int | None, value: int) -> int:
            return value if override is None else override

        return dataclasses.replace(
            base,
            max_running_requests=pick(self.max_running_requests, base.max_running_requests),
            max_queued_requests=pick(self.max_queued_requests, base.max_queued_requests),
            max_total_tokens=pick(self.cache_tokens, base.max_total_tokens),
            page_size=pick(self.page_size, base.page_size),
            chunked_prefill_size=pick(self.chunked_prefill_size, base.chunked_prefill_size),
            context_length=pick(self.context_length, base.context_length),
        )
