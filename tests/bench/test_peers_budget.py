"""The budget bursts of the gateway comparison (bench/peers_budget.py): variants, their answers,
what a burst served and which of issue 36's targets it meets."""

from __future__ import annotations

import random

import pytest
from peers_budget import (
    EOS_PROB,
    VARIANTS,
    Answers,
    Served,
    budget_key,
    burst_targets,
    crafted_prompt,
    plan_bursts,
    served_summary,
    variant_answers,
    variant_prompts,
)

from backends.emulator.tokenizer import vocabulary


def _simulated_mean(a: Answers, rng: random.Random, runs: int = 4000) -> float:
    """The emulator's loop (scheduler._emit_token): a stop word ends before the token, an EOS
    after it, max_tokens caps."""
    stops = set(vocabulary()[: a.stop_words])
    words = vocabulary()
    total = 0
    for _ in range(runs):
        n = 0
        while n < a.max_tokens:
            if rng.choice(words) in stops:
                break
            n += 1
            if a.eos and rng.random() < EOS_PROB:
                break
        total += n
    return total / runs


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_expected_answer_length_is_the_emulators(variant: str) -> None:
    history, burst = variant_answers(variant)
    for a in {history, burst}:
        sim = _simulated_mean(a, random.Random(5))
        assert sim == pytest.approx(a.mean_tokens, rel=0.06)
    assert history.mean_tokens == pytest.approx(100, rel=0.05)  # short answers, cap 1,024
    if variant == "long":  # longer than anything learned from the history
        assert burst.mean_tokens > 4 * history.mean_tokens and burst.max_tokens == 2048


def test_answers_tell_the_backend_how_to_end() -> None:
    assert Answers(1024).body_extra() == {"ignore_eos": False}
    long = Answers(2048, eos=False, stop_words=2).body_extra()
    assert long == {"ignore_eos": True, "stop": list(vocabulary()[:2])}
    with pytest.raises(ValueError, match="stop words"):
        Answers(10, eos=False)
    with pytest.raises(ValueError):
        Answers(10, stop_words=5)  # OpenAI and sglang-router take at most 4 stop strings


def test_prompts_of_each_variant() -> None:
    rng = random.Random(1)
    short = variant_prompts("short", rng, 3)
    assert len(set(short)) == 3 and all(p.isascii() for p in short[:1] if "café" not in p)
    cjk = variant_prompts("cjk_code", rng, 1)[0]
    assert any("\u4e00" <= c <= "\u9fff" for c in cjk) and "{" in cjk
    assert len(cjk.encode()) > 1.5 * len(cjk)  # multi-byte text
    with pytest.raises(ValueError, match="unknown budget variant"):
        variant_prompts("nope", rng, 1)


def test_a_crafted_prompt_looks_cheap_where_a_sampler_looks() -> None:
    p = crafted_prompt(random.Random(2))
    assert len(p) > 16_384  # what the old estimator sampled
    step = len(p) // 64
    windows = [p[i * step : i * step + 64] for i in range(1, 64)]
    cheap = sum(1 for w in windows if w.isascii())
    assert cheap >= 0.8 * len(windows)  # most windows every 1/64 fall on "a a a ..."
    assert len(p.encode()) > 1.15 * len(p)  # the dense CJK / emoji between them


def test_budgets_are_sized_so_the_burst_asks_twice_as_much() -> None:
    bursts = plan_bursts(
        ["short", "long"], [10, 30], warmup=3, oversubscribe=2.0, rng=random.Random(3),
        prompt_tokens=lambda p: 50,
    )  # fmt: skip
    assert [(b.variant, b.parallel) for b in bursts] == [
        ("short", 10), ("short", 30), ("long", 10), ("long", 30)
    ]  # fmt: skip
    short10 = bursts[0]
    assert short10.key == budget_key("short", 10) == "tw-peers-budget-short-10"
    assert short10.mean_request_tokens == pytest.approx(50 + short10.answers.mean_tokens)
    assert short10.burst == round(10 * short10.mean_request_tokens / 2)
    assert short10.refill_per_second == round(short10.burst / 60, 3)
    assert len(short10.prompts) == 10 and len(short10.warmup_prompts) == 3
    long10 = bursts[2]
    assert long10.warmup_answers == short10.answers and long10.answers.max_tokens == 2048
    assert budget_key("cjk_code", 300) == "tw-peers-budget-cjk-code-300"
    with pytest.raises(ValueError):
        plan_bursts(["short"], [1], warmup=1, oversubscribe=0, rng=random.Random(),
                    prompt_tokens=len)  # fmt: skip


def test_served_counts_admitted_streams_and_whole_answers() -> None:
    streams = [
        Served(200, "stop", 100, 50),  # whole: 150
        Served(200, "length", 100, 30),  # cut short: 130
        Served(200, None, 100, 0),  # broke before a token: its prompt was served
        Served(429, None, 100, 0),  # refused: nothing
    ]
    got = served_summary(streams, allowed=500.0, backend_tokens=520.0)
    assert got["served_tokens"] == 380 and got["whole_tokens"] == 150
    assert got["served_ratio"] == 0.76 and got["whole_share"] == round(150 / 380, 4)
    assert got["served_overshoot_tokens"] == 0 and got["backend_overshoot_tokens"] == 20
    assert got["finish_reasons"] == {"length": 1, "none": 1, "stop": 1}
    over = served_summary([Served(200, "stop", 400, 200)], allowed=500.0)
    assert over["served_overshoot_tokens"] == 100 and "backend_overshoot_tokens" not in over
    assert served_summary([], allowed=1.0)["whole_share"] is None
    with pytest.raises(ValueError):
        served_summary([], allowed=0.0)


def test_burst_targets() -> None:
    ok = {"served_ratio": 0.93, "whole_share": 0.9, "served_overshoot_tokens": 0.0}
    assert burst_targets(ok) == {"no_overshoot": True, "served": True, "whole": True}
    bad = {"served_ratio": 1.2, "whole_share": 0.5, "served_overshoot_tokens": 300.0}
    assert burst_targets(bad) == {"no_overshoot": False, "served": True, "whole": False}
    low = {"served_ratio": 0.89, "whole_share": None, "served_overshoot_tokens": 0.0}
    assert burst_targets(low) == {"no_overshoot": True, "served": False, "whole": None}
    assert burst_targets({}) == {"no_overshoot": None, "served": None, "whole": None}


def test_gateway_counters_and_false_rejects_are_read_from_their_pages() -> None:
    from peers_arms import envoy_counters, false_rejects_of

    stats = "\n".join([
        "cluster.pool_chat.ratelimit.ok: 40",
        "cluster.pool_chat.ratelimit.error: 3",
        "cluster.pool_other.ratelimit.error: 2",
        "cluster.pool_chat.ratelimit.failure_mode_allowed: 5",
        "http.edge.ext_proc.streams_started: 7",
        "http.edge.downstream_rq_total: 99",
        "cluster.pool_chat.upstream_rq_time: P0(nan,1)",
        "cluster.ratelimit.upstream_rq_total: 80",  # the service's cluster, not decisions
        "cluster.ratelimit.internal.upstream_rq_200: 80",
    ])  # fmt: skip
    assert envoy_counters(stats) == {
        "ratelimit.ok": 40, "ratelimit.error": 5, "ratelimit.failure_mode_allowed": 5,
        "ext_proc.streams_started": 7,
    }  # fmt: skip
    page = (
        "# TYPE tokenweir_ratelimit_false_rejects_total counter\n"
        'tokenweir_ratelimit_false_rejects_total{tenant="budget-short-100"} 12.0\n'
        'tokenweir_ratelimit_false_rejects_total{tenant="other"} 4.0\n'
    )
    assert false_rejects_of(page, "budget-short-100") == 12.0
    assert false_rejects_of(page, "nobody") == 0.0
