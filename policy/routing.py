"""Policy of cache-aware routing: how a pool's requests choose a replica (docs/policy.md,
"Routing"; docs/operations.md, "Prefix index").

``ring_hash`` (the default) hashes the session / prefix headers onto Envoy's ring. ``prefix_index``
adds the endpoint picker: the filter server follows every replica's KV-cache events, asks the
prefix index how much of the prompt each replica holds, weighs that against load and names the
replica in a request header that Envoy's override-host load balancer honours; ring hash stays
the fallback (picker down, index cold, chosen host unhealthy or ejected).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from policy.decode import Duration, Range, Size
from wire.contract import ENDPOINT_HEADER

__all__ = ["EMULATOR_TOKENIZER", "ENDPOINT_HEADER", "RoutingPolicy"]


# routing.tokenizer: the emulator's word tokenizer and chat template (else a model directory)
EMULATOR_TOKENIZER = "emulator"


@dataclass(frozen=True)
class RoutingPolicy:
    """Per pool; every knob but ``mode`` matters only with ``mode: prefix_index``."""

    mode: Literal["ring_hash", "prefix_index"] = "ring_hash"
    # how the picker scores replicas: "weights" (cache share against load, the knobs below) or
    # "predicted_ttft" (experimental: the lowest predicted time to first token from the prefill
    # backlog, uncached tokens and each replica's learned rates; filters/plugins/picker/score_ttft.py)
    scoring: Literal["weights", "predicted_ttft"] = "weights"
    # predicted_ttft: a replica whose predicted decode step (s per output token) with the request
    # added exceeds this is not picked while another stays within it (0: no budget)
    tpot_budget: Annotated[float, Duration(0.0, 10)] = 0.0
    # score = cache_weight × (cached share of the prompt) − (1 − cache_weight) × (relative load)
    cache_weight: Annotated[float, Range(0.0, 1.0)] = 0.7
    # a replica whose in-flight requests exceed max_imbalance × the pool mean (+1) is not picked
    # (with balance_window: only while its share of the recent picks exceeds max_share too)
    max_imbalance: Annotated[float, Range(1.0, 100.0)] = 1.5
    # picks (decayed) over which each replica's share of the recent picks is counted; it places
    # prompts no replica holds (with the radix tree's size) and lets a busy replica keep the
    # prompts it holds while its share is within max_share. 0: in-flight counts alone
    balance_window: Annotated[int, Range(0, 1_000_000)] = 64
    # the recent share (× the pool mean) above which a replica over max_imbalance is skipped
    max_share: Annotated[float, Range(1.0, 100.0)] = 1.3
    # below this many cached tokens on every replica the picker leaves the choice to ring hash
    min_prefix_tokens: Annotated[int, Range(0, 10_000_000)] = 256
    # a replica whose event stream is silent this long is "unknown" (never wrongly "cached")
    index_ttl: Annotated[float, Duration(0.1, 3600)] = 10.0
    # memory bound of the index (distinct block hashes over all replicas)
    max_index_blocks: Annotated[int, Range(1_000, 100_000_000)] = 2_000_000
    # must equal the backends' --page-size (block hashes are per page)
    page_size: Annotated[int, Range(1, 4096)] = 1
    # how the picker renders and tokenizes prompts: "emulator" (the emulator's word tokenizer and
    # chat template), or the model's directory as the backends' --tokenizer-path names it
    # (tokenizer.json, tokenizer_config.json / chat_template.jinja; read by the filter servers)
    tokenizer: str = EMULATOR_TOKENIZER
    # each replica publishes KV events on tcp://HOST:(PORT + offset) and serves replays on
    # PORT + replay offset (default offset + 1: replicas on one host with consecutive ports need
    # a replay offset past their event ports, e.g. 2000)
    kv_events_port_offset: Annotated[int, Range(1, 60_000)] = 1000
    kv_events_replay_offset: Annotated[int, Range(1, 60_000)] | None = None
    # granularity of the picker's prompt checkpoints (bytes of rendered prompt)
    checkpoint_bytes: Annotated[int, Size(64, 1024**2)] = 1024
    # a routed prompt counts as cached on its replica for this long, until its events arrive
    pending_ttl: Annotated[float, Duration(0.0, 600)] = 1.0
    # a prompt with no useful match goes where its wait is least: the weight of each replica's
    # prefill backlog against its in-flight load (0: backlogs ignored)
    backlog_weight: Annotated[float, Range(0.0, 100.0)] = 1.0
    # backlog tokens that cost nothing: about one prefill step (SGLang's chunked_prefill_size)
    backlog_allowance: Annotated[int, Range(0, 10_000_000)] = 8192
    # a prompt whose best replica holds at least this share of it stays with its cache, backlog
    # or not (below it: little to lose by going where the wait is least)
    sticky_share: Annotated[float, Range(0.0, 1.0)] = 0.5
    # a request sent where its new prefix is being prefilled right now waits at most this long
    # for that prefill to be stored instead of computing it again (0: never waits)
    coalesce_wait: Annotated[float, Duration(0.0, 60)] = 1.0
    # the index keeps one block in about this many tokens (its "anchors", see anchor_every)
    anchor_tokens: Annotated[int, Range(1, 4096)] = 16

    @property
    def anchor_every(self) -> int:
        """Pages per anchor: the largest power of two <= anchor_tokens / page_size, from 1 to
        256. The index keeps only blocks whose hash has that many low bits zero, so a prompt's
        cached length is known to within about anchor_tokens tokens (rounded down, never up)."""
        pages = max(1, min(256, self.anchor_tokens // self.page_size))
        return 1 << (pages.bit_length() - 1)

    @property
    def replay_offset(self) -> int:
        """A replica's replay port minus its HTTP port."""
        if self.kv_events_replay_offset is not None:
            return self.kv_events_replay_offset
        return self.kv_events_port_offset + 1

    def __post_init__(self) -> None:
        if self.replay_offset == self.kv_events_port_offset:
            raise ValueError("kv_events_replay_offset: must differ from kv_events_port_offset")
        if not self.tokenizer.strip():
            raise ValueError("tokenizer: 'emulator' or a model directory, not empty")
        if self.mode == "prefix_index" and self.index_ttl < 1.0:
            raise ValueError("index_ttl: must be >= 1s with mode prefix_index (replay probes)")
