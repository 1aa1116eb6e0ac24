"""controlplane.up_parts.kv_event_args: the emulator flags `tokenweir up` adds for the picker."""

from __future__ import annotations

import json

from controlplane.policy import Address
from controlplane.policy.routing import RoutingPolicy
from controlplane.up_parts import kv_event_args


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
