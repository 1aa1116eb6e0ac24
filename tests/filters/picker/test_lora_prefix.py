"""The prefix picker folds a LoRA adapter into its prefix hashes: the emulator's real radix cache
(a tree per adapter, events carrying ``lora_id``) feeds the index, and adapter A's cached prefix
is found for adapter A only, on the replica that cached it under A."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from backends.emulator.radix_cache import RadixCache
from backends.emulator.tokenizer import encode
from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.pool import PoolPicker
from policy.lora import LoraAdapters
from policy.model import Address, LlmPool
from policy.routing import RoutingPolicy
from prefixindex.adapters import adapter_id
from prefixindex.wire import KVEventBatch

NAMES = ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003")


def _picker() -> tuple[PoolPicker, dict[str, RadixCache]]:
    cfg = LlmPool(
        models=("m", "sql", "legal"),
        endpoints=tuple(Address.parse(n) for n in NAMES),
        routing=RoutingPolicy(
            mode="prefix_index", checkpoint_bytes=64, min_prefix_tokens=32, pending_ttl=0.0
        ),
        lora=LoraAdapters(adapters=("sql", "legal")),
    )
    now = 100.0
    picker = PoolPicker(
        "chat", cfg, PickerMetrics(CollectorRegistry()), clock=lambda: now, wall=lambda: now
    )
    caches = {n: RadixCache(100_000, record_events=True) for n in NAMES}
    for n in NAMES:
        _publish(picker, n, caches[n], 0)
    return picker, caches


def _publish(picker: PoolPicker, name: str, cache: RadixCache, seq: int) -> None:
    picker.index.apply(name, seq, KVEventBatch(ts=0.0, events=cache.take_events()))
    picker.index.heard(name, picker.clock())


def _pick(picker: PoolPicker, data: bytes, adapter: str | None) -> tuple[str | None, str, int]:
    prompt = picker.prompt(data, adapter)
    picker.map.extend(prompt.data, prompt.marks, 0, len(prompt.marks), prompt.root)
    pick = picker.pick(picker.prompt(data, adapter))
    return pick.replica, pick.reason, pick.predicted_tokens


def test_an_adapters_prefix_is_found_only_for_that_adapter() -> None:
    picker, caches = _picker()
    doc = " ".join(f"clause{i}" for i in range(300))
    sql_holder, base_holder = NAMES[1], NAMES[2]
    # the same document cached under adapter sql on one replica, under the base model on another
    caches[sql_holder].insert(encode(doc), lora_id=adapter_id("sql"))
    caches[base_holder].insert(encode(doc))
    _publish(picker, sql_holder, caches[sql_holder], 1)
    _publish(picker, base_holder, caches[base_holder], 1)
    question = (doc + " what does it say").encode()

    replica, reason, tokens = _pick(picker, question, "sql")
    assert (replica, reason) == (sql_holder, "cache")
    assert 250 <= tokens <= 300
    replica, reason, _ = _pick(picker, question, None)
    assert (replica, reason) == (base_holder, "cache")
    # another adapter has this text cached nowhere: neither holder's blocks count for it
    replica, reason, tokens = _pick(picker, question, "legal")
    assert reason != "cache" and tokens == 0


def test_an_adapters_checkpoints_and_points_differ_from_the_base_models() -> None:
    picker, _ = _picker()
    data = " ".join(f"w{i}" for i in range(100)).encode()
    base, sql = picker.prompt(data), picker.prompt(data, "sql")
    assert base.marks and not set(base.marks) & set(sql.marks)
    picker.map.extend(sql.data, sql.marks, 0, len(sql.marks), sql.root)
    assert picker.map.lookup(base.marks) == []
    assert len(picker.map.lookup(sql.marks)) == len(sql.marks)
    assert picker.adapter_of("sql") == "sql" and picker.adapter_of("m") is None


async def test_after_the_lora_plugin_the_picker_moves_a_request_only_to_its_cached_prefix() -> None:
    """Route ``[.., lora, picker]``: adapter affinity's replica stands unless the index finds the
    adapter's prefix cached on another; then the request goes there, and the lora plugin's slot
    model counts it there."""
    import json
    from types import SimpleNamespace

    from filters.api import Context, RouteInfo
    from filters.plugins.lora.plugin import LoraPlugin
    from filters.plugins.picker.plugin import PickerPlugin
    from filters.plugins.picker.registry import Pickers
    from policy.routing import ENDPOINT_HEADER

    picker, caches = _picker()
    pickers = Pickers(registry=CollectorRegistry(), clock=picker.clock, wall=picker.clock)
    picker.metrics = pickers.metrics
    pickers._pools["chat"] = (None, picker)
    plug = PickerPlugin({}, SimpleNamespace(pickers=pickers))  # type: ignore[arg-type]
    pools = {"chat": picker.cfg}
    lora = LoraPlugin({}, SimpleNamespace(policy=SimpleNamespace(pools=pools), lora=None))  # type: ignore[arg-type]
    doc = " ".join(f"clause{i}" for i in range(300))

    async def send(text: str) -> tuple[str, str, Context]:
        ctx = Context(route=RouteInfo(name="r", pool="chat"), started=0.0, path="/generate")
        ctx.model = "sql"
        body = json.dumps({"text": text, "lora_path": "sql"}).encode()
        placed = await lora.request_body(ctx, body)
        assert placed is not None and placed.body is not None
        moved = await plug.request_body(ctx, placed.body)
        chosen = (moved or placed).set_headers[ENDPOINT_HEADER]
        return placed.set_headers[ENDPOINT_HEADER], chosen, ctx

    # nothing cached: adapter affinity's replica stands (the picker scores only it)
    first, chosen, ctx = await send(doc + " one")
    assert chosen == first and ctx.plan.adapter_replica == first
    await plug.stream_end(ctx)
    await lora.stream_end(ctx)
    # the adapter's prefix is cached (under sql) on another replica: the request goes there
    holder = next(n for n in NAMES if n != first)
    caches[holder].insert(encode(doc), lora_id=adapter_id("sql"))
    _publish(picker, holder, caches[holder], 1)
    warm = picker.prompt((doc + " two").encode(), "sql")
    picker.map.extend(warm.data, warm.marks, 0, len(warm.marks), warm.root)
    placed_on, chosen, ctx = await send(doc + " two")
    assert placed_on == first and chosen == holder and ctx.plan.adapter_replica == holder
    await lora.stream_end(ctx)
    aff = lora.affinity("chat")
    assert aff is not None and holder in aff.holders("sql")
    assert aff._inflight.get(first, 0) == 0 and aff._inflight.get(holder, 0) == 0
