"""The balance window (routing.balance_window, max_share): recent shares of the picks keep a busy
holder's followers and place prompts nobody holds (pure decision, and the pool's counting)."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry

from filters.plugins.picker.metrics import PickerMetrics
from filters.plugins.picker.pool import PoolPicker
from filters.plugins.picker.score import Candidate, Pick, Weights, choose
from policy.model import Address, LlmPool
from policy.routing import RoutingPolicy

INFLIGHT_ONLY = Weights(cache_weight=0.7, max_imbalance=1.5, min_prefix_tokens=100)
WINDOW = Weights(cache_weight=0.7, max_imbalance=1.5, min_prefix_tokens=100, balance_window=64,
                 max_share=1.3)  # fmt: skip


def c(
    name: str, matched: int, inflight: int, recent: float, blocks: int = 0, shared: bool = True
) -> Candidate:
    """A candidate; what it holds is a prefix other requests share unless ``shared`` is False."""
    return Candidate(name, True, True, matched, matched, inflight, blocks, 0, recent, shared)


def test_a_busy_holder_within_its_share_keeps_the_prompt_it_holds() -> None:
    # mean in flight 3, bound 6: a's 8 + 1 is past it, but a has been sent no more than the rest
    pool = [c("a", 1000, 8, 10.0), c("b", 0, 0, 10.0), c("c", 0, 1, 10.0)]
    assert choose(pool, 1000, INFLIGHT_ONLY).replica == "b"  # in flight alone: moved off
    pick = choose(pool, 1000, WINDOW)
    assert (pick.replica, pick.reason) == ("a", "cache")


def test_a_busy_holder_past_its_share_is_skipped() -> None:
    # recent mean 10, cap 13: a has taken 20 of the last picks
    pool = [c("a", 1000, 8, 20.0), c("b", 0, 0, 5.0), c("c", 0, 1, 5.0)]
    pick = choose(pool, 1000, WINDOW)
    assert pick.replica == "b" and pick.reason == "load"


def test_a_busy_holder_keeps_a_conversations_own_history_past_its_share() -> None:
    """What it holds is this conversation's own earlier turns (no other request matched that
    prefix): moving it would prefill it all again, so neither rule moves it; a prompt it holds
    less than sticky_share of is moved as before."""
    pool = [c("a", 1000, 8, 20.0, shared=False), c("b", 0, 0, 5.0), c("c", 0, 1, 5.0)]
    assert choose(pool, 1000, WINDOW).replica == "a"
    assert choose(pool, 1000, INFLIGHT_ONLY).replica == "a"
    little = [c("a", 400, 8, 20.0, shared=False), c("b", 0, 0, 5.0), c("c", 0, 1, 5.0)]
    assert choose(little, 1000, WINDOW).replica == "b"


def test_a_replica_under_the_in_flight_bound_is_never_skipped_for_its_share() -> None:
    pool = [c("a", 1000, 3, 30.0), c("b", 0, 2, 1.0), c("c", 0, 2, 1.0)]
    assert choose(pool, 1000, WINDOW).replica == "a"


def test_a_prompt_nobody_holds_goes_where_fewer_were_sent_and_less_is_held() -> None:
    # a is idle this instant but has taken most recent picks and holds the most
    pool = [c("a", 0, 0, 20.0, blocks=900), c("b", 0, 2, 4.0, blocks=300), c("c", 0, 2, 6.0, 300)]
    assert choose(pool, 1000, INFLIGHT_ONLY).replica == "a"
    pick = choose(pool, 1000, WINDOW)
    assert (pick.replica, pick.reason) == ("b", "load")


def test_no_picks_yet_places_like_in_flight_ties() -> None:
    pool = [c("a", 0, 0, 0.0, blocks=10), c("b", 0, 0, 0.0, blocks=0)]
    assert choose(pool, 1000, WINDOW).replica == "b"  # the emptier cache


def test_the_pool_counts_its_picks_over_a_decaying_window() -> None:
    names = ("127.0.0.1:7001", "127.0.0.1:7002")
    cfg = LlmPool(
        models=("m",),
        endpoints=tuple(Address.parse(n) for n in names),
        routing=RoutingPolicy(mode="prefix_index", balance_window=4),
    )
    picker = PoolPicker("chat", cfg, PickerMetrics(CollectorRegistry()))
    assert picker.weights.balance_window == 4 and picker.weights.max_share == 1.3
    a, b = names
    prompt = picker.prompt(b"x" * 100)
    for name in (a, a, b):
        picker.record(prompt, Pick(name, "load"))
    assert math.isclose(picker.recent[a], (1 * 0.75 + 1) * 0.75)
    assert math.isclose(picker.recent[b], 1.0)
    off = PoolPicker("chat", LlmPool(models=("m",), endpoints=cfg.endpoints,
                                     routing=RoutingPolicy(mode="prefix_index", balance_window=0)),
                     PickerMetrics(CollectorRegistry()))  # fmt: skip
    off.record(prompt, Pick(a, "load"))
    assert off.recent[a] == 0.0  # window 0: in-flight counts alone
