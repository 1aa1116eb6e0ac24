"""tokenweir.up_parts.kv_event_args: the emulator flags `tokenweir up` adds for the picker."""

from __future__ import annotations

import json

from policy import Address
from policy.routing import RoutingPolicy
from tokenweir.up_parts import kv_event_args


def test_ring_hash_pools_need_no_flags() -> None:
    assert kv_event_args(RoutingPolicy(), Address("127.0.0.1", 30001)) == []


def test_picker_pools_publish_events_and_tokenize_with_the_pickers_model() -> None:
    addr = Address("127.0.0.1", 30001)
    args = kv_event_args(RoutingPolicy(mode="prefix_index", page_size=4), addr)
    cfg = json.loads(args[args.index("--kv-events-config") + 1])
    assert cfg["endpoint"] == "tcp://*:31001" and cfg["replay_endpoint"] == "tcp://127.0.0.1:31002"
    assert args[args.index("--page-size") + 1] == "4"
    assert "--tokenizer-path" not in args
    model = RoutingPolicy(mode="prefix_index", tokenizer="/models/llama-3.1-8b")
    args = kv_event_args(model, addr)
    assert args[args.index("--tokenizer-path") + 1] == "/models/llama-3.1-8b"


def test_the_replay_port_follows_its_offset_and_the_picker_looks_there() -> None:
    from filters.plugins.picker.pool import feeds_for

    addr = Address("127.0.0.1", 30001)
    routing = RoutingPolicy(mode="prefix_index", kv_events_replay_offset=2000)
    cfg = json.loads(kv_event_args(routing, addr)[1])
    assert cfg["endpoint"] == "tcp://*:31001" and cfg["replay_endpoint"] == "tcp://127.0.0.1:32001"
    (feed,) = feeds_for([addr], routing)
    assert feed.endpoint == "tcp://127.0.0.1:31001"
    assert feed.replay_endpoint == "tcp://127.0.0.1:32001"


def test_a_vllm_pool_runs_vllm_flavoured_emulators_and_its_picker_reads_vllm_events() -> None:
    from filters.plugins.picker.pool import feeds_for
    from policy.model import LlmPool
    from policy.saturation import PoolCapacity
    from tokenweir.up_parts import flavor_args

    assert flavor_args(LlmPool(models=("m",))) == []
    pool = LlmPool(models=("m",), backend="vllm", capacity=PoolCapacity(max_running_requests=8))
    assert flavor_args(pool) == ["--flavor", "vllm", "--max-num-seqs", "8"]
    (feed,) = feeds_for([Address("127.0.0.1", 30001)], RoutingPolicy(), pool.backend)
    assert feed.backend == "vllm"
