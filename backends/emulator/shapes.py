"""The JSON the emulator answers with, field by field as SGLang writes it.

OpenAI: error objects, ``usage``, chat and text completions (non-streamed; the streamed chunks
are written as text in :mod:`backends.emulator.openai_api`). Native: ``/generate`` results and
``/get_server_info``. Readers of a real server's answers (``backends.sglang.capacity``) do not
use these: what a server sends is checked field by field there.
"""

from __future__ import annotations

from typing import TypedDict

from wire.jsontypes import JsonObject, JsonValue

__all__ = [
    "CachedTokens",
    "ChatChoice",
    "ChatMessage",
    "Completion",
    "DisaggInfo",
    "EmulatorFacts",
    "ErrorBody",
    "GenerateResult",
    "LoraInfo",
    "LoraPath",
    "MetaInfo",
    "SchedulerState",
    "ServerInfo",
    "TextChoice",
    "Usage",
]


class ErrorBody(TypedDict):
    object: str  # "error"
    message: str
    type: str
    param: str | None
    code: int


class CachedTokens(TypedDict):
    cached_tokens: int


class Usage(TypedDict):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: CachedTokens | None  # only with --enable-cache-report and a hit


class ChatMessage(TypedDict):
    role: str
    content: str
    reasoning_content: str | None
    tool_calls: list[JsonObject] | None


class ChatChoice(TypedDict):
    index: int
    message: ChatMessage
    logprobs: None
    finish_reason: str | None
    matched_stop: str | None


class TextChoice(TypedDict):
    index: int
    text: str
    logprobs: None
    finish_reason: str | None
    matched_stop: str | None


class Completion(TypedDict):
    id: str
    object: str  # "chat.completion" or "text_completion"
    created: int
    model: JsonValue  # the request's, echoed
    choices: list[ChatChoice | TextChoice]
    usage: Usage


class MetaInfo(TypedDict):
    id: str
    finish_reason: JsonObject | None  # {"type": "length" | "stop" | "abort", ...}
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float


class GenerateResult(TypedDict):
    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class DisaggInfo(TypedDict):
    disaggregation_mode: str
    disaggregation_bootstrap_port: int


class LoraPath(TypedDict):
    lora_name: str
    lora_path: str


class LoraInfo(TypedDict):
    enable_lora: bool
    lora_paths: list[LoraPath] | None
    max_loras_per_batch: int
    max_loaded_loras: int | None
    max_lora_rank: int | None
    loaded_lora_adapters: dict[str, str]  # the emulator's: name -> path
    resident_lora_adapters: list[str]  # the emulator's: in the batch's slots


class EmulatorFacts(TypedDict):
    profile: str
    time_scale: float
    source: str


class SchedulerState(TypedDict):
    max_total_num_tokens: int
    max_running_requests: int
    last_gen_throughput: float


class ServerInfo(DisaggInfo, LoraInfo):
    """``/get_server_info``: the server arguments, and the scheduler's state in
    ``internal_states`` (newer SGLang; older ones put those at the top level too)."""

    model_path: str
    served_model_name: str
    host: str
    port: int
    max_running_requests: int
    max_queued_requests: int
    max_total_tokens: int
    max_total_num_tokens: int
    chunked_prefill_size: int
    page_size: int
    context_length: int
    schedule_policy: str
    enable_priority_scheduling: bool
    schedule_low_priority_values_first: bool
    priority_scheduling_preemption_threshold: int
    abort_on_priority_when_disabled: bool
    enable_metrics: bool
    enable_cache_report: bool
    random_seed: int
    kv_events_config: str | None
    version: str
    emulator: EmulatorFacts
    internal_states: list[SchedulerState]
