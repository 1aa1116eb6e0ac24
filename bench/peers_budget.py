"""The budget bursts of the gateway comparison (bench/peers.py): variants and arithmetic. Pure.

A burst is N parallel streaming requests on one key whose token budget is ``burst`` tokens
refilled at ``refill_per_second`` (burst / 60: a per-minute budget). Before it, the key gets a
history of answers (``warmup`` sequential requests), the same in every arm: a gateway that learns
how long its tenants' answers are (tokenweir's learned reservations) learns it there.

Variants (``VARIANTS``), each sized so that the burst asks for ``oversubscribe`` times its
budget (the gateway must turn part of it away):

- ``short``: short English prompts, ``max_tokens`` 1,024, answers that end by themselves after
  ~100 tokens (chat as it is: far shorter than the cap).
- ``long``: the same history (short answers), then a burst whose answers run ~500 tokens and
  up to 2,048: longer than any estimate learned from the history.
- ``cjk_code``: prompts of Chinese/Japanese text and dense code (many tokens per byte to a
  byte-level BPE, far from an English words-per-token guess), short answers.
- ``crafted``: prompts over 16 KiB laid out against a sampling estimator: cheap ASCII words
  wherever a window every 1/64 of the text would look, dense CJK and emoji between them
  (tests/filters/test_prompt_bound.py), short answers.

Answer lengths are the emulator's, started with ``--stop-prob EOS_PROB``: after each token an
answer ends with ``finish_reason: "stop"`` with that chance unless the request sets
``ignore_eos`` (a geometric length, mean ~1/EOS_PROB); each decode step draws a word of the
emulator's 1,024-word vocabulary, and a request's ``stop`` list of ``k`` of those words ends
the answer at each step with chance k/1024 (also ``"stop"``, with ``ignore_eos`` too); at
``max_tokens`` it ends with ``"length"``. (OpenAI and sglang-router accept at most 4 stop
strings, hence both.) Prompt tokens are a byte-level BPE's (the emulators run with ``--tokenizer-path``),
so CJK, emoji and code cost what they cost a real model, not one token per word.

What a burst served (``served_summary``): per admitted stream its prompt tokens plus the
completion tokens its client received; the share of them in answers that ended by themselves
(``finish_reason: "stop"``; a ``"length"`` is an answer cut short, by its cap or by a gateway);
the overshoot beyond ``burst + refill * elapsed``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from backends.emulator.tokenizer import vocabulary

__all__ = [
    "EOS_PROB",
    "VARIANTS",
    "Answers",
    "BudgetBurst",
    "Served",
    "budget_key",
    "burst_targets",
    "cjk_code_prompt",
    "crafted_prompt",
    "plan_bursts",
    "prose_prompt",
    "served_summary",
    "variant_answers",
    "variant_prompts",
]

VARIANTS = ("short", "long", "cjk_code", "crafted")


EOS_PROB = 0.01  # the emulators' --stop-prob in the budget phase


@dataclass(frozen=True, slots=True)
class Answers:
    """How long the emulator's answers run: the emulator's EOS chance per token (unless
    ``eos`` is off: ``ignore_eos``) and ``stop_words`` words of its vocabulary."""

    max_tokens: int
    eos: bool = True
    stop_words: int = 0

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or not 0 <= self.stop_words <= 4:
            raise ValueError("max_tokens must be >= 1 and stop_words within 0..4")
        if not self.eos and not self.stop_words:
            raise ValueError("answers without EOS need stop words (or they all run to the cap)")

    def body_extra(self) -> dict[str, object]:
        """What each request adds to its body (every arm passes both to the backend)."""
        out: dict[str, object] = {"ignore_eos": not self.eos}
        if self.stop_words:
            out["stop"] = list(vocabulary()[: self.stop_words])
        return out

    @property
    def mean_tokens(self) -> float:
        """The expected completion tokens: the sum over j = 1..max of P(length >= j), where a
        j-th token needs j draws that are no stop word and j - 1 tokens without an EOS."""
        s, e = self.stop_words / 1024, EOS_PROB if self.eos else 0.0
        q = (1.0 - s) * (1.0 - e)
        return (1.0 - s) * (1.0 - q**self.max_tokens) / (1.0 - q)


SHORT = Answers(max_tokens=1024)  # mean ~100 tokens
LONG = Answers(max_tokens=2048, eos=False, stop_words=2)  # mean ~500, 1.8% reach 2,048


@dataclass(frozen=True, slots=True)
class BudgetBurst:
    """One burst of one variant: its key, its requests, its budget."""

    variant: str
    parallel: int
    key: str
    prompts: tuple[str, ...]  # the burst's, one per request
    warmup_prompts: tuple[str, ...]
    answers: Answers  # the burst's
    warmup_answers: Answers
    burst: int  # the budget, tokens
    refill_per_second: float
    mean_request_tokens: float  # real prompt + expected answer (sglang-router counts requests)


def budget_key(variant: str, parallel: int) -> str:
    return f"tw-peers-budget-{variant.replace('_', '-')}-{parallel}"


# English words the emulators' byte-level BPE was trained on (tests/chat_model.py): English
# prose compresses to ~4 bytes a token, as with a real model's tokenizer
_WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "hello",
    "world",
    "it's",
    "don't",
    "we'll",
    "café",
]
_CJK = "数据模型回答问题用户请求预算令牌时间团队报告東京の天気は晴れですが明日は雨になるでしょう"
_CODE = ("for(i=0;i<n;++i){a[i]=b[i]*c[i]+d[i];}", "if(x&&!y){return f(x,y)|0x1F;}",
         "m={'k':[1,2,3],'v':(4,5)};", "#include<stdio.h>\nint main(){puts(\"ok\");}",
         "x=[y**2 for y in range(9) if y%3]", "SELECT id,sum(n) FROM t GROUP BY id;")  # fmt: skip
_DENSE = "中文😀語言🚀"


def prose_prompt(rng: random.Random, words: int = 60) -> str:
    """English prose of ``words`` words (a number first, so no two prompts are alike)."""
    return f"{rng.randrange(10**9)} " + " ".join(rng.choice(_WORDS) for _ in range(words))


def cjk_code_prompt(rng: random.Random, pieces: int = 8) -> str:
    """Chinese/Japanese sentences and dense code, alternating."""
    out = [str(rng.randrange(10**9))]
    for _ in range(pieces):
        start = rng.randrange(len(_CJK) - 24)
        out.append(_CJK[start : start + 24])
        out.append(rng.choice(_CODE))
    return "\n".join(out)


def crafted_prompt(rng: random.Random, cheap_chars: int = 256, dense_repeats: int = 4) -> str:
    """Over 16 KiB characters: 64 blocks of cheap words ("a a a ...", where a sampler's
    windows every 1/64 of the text fall) each followed by dense CJK and emoji."""
    out = []
    for _ in range(64):
        out.append("a " * (cheap_chars // 2))
        out.append(_DENSE * dense_repeats)
    out.append(f" {rng.randrange(10**9)}")  # at the end: the blocks stay where a sampler looks
    return "".join(out)


def variant_prompts(variant: str, rng: random.Random, count: int) -> list[str]:
    if variant in ("short", "long"):
        return [prose_prompt(rng) for _ in range(count)]
    if variant == "cjk_code":
        return [cjk_code_prompt(rng) for _ in range(count)]
    if variant == "crafted":
        return [crafted_prompt(rng) for _ in range(count)]
    raise ValueError(f"unknown budget variant {variant!r}; expected one of {', '.join(VARIANTS)}")


def variant_answers(variant: str) -> tuple[Answers, Answers]:
    """(the history's answers, the burst's answers)."""
    if variant not in VARIANTS:
        raise ValueError(
            f"unknown budget variant {variant!r}; expected one of {', '.join(VARIANTS)}"
        )
    return SHORT, LONG if variant == "long" else SHORT


@dataclass(frozen=True, slots=True)
class Served:
    """One request of a burst as its client saw it."""

    status: int
    finish_reason: str | None
    prompt_tokens: int  # the backend's count of the request's prompt
    completion_tokens: int  # what the client received (the usage chunk's, else chunks)


def served_summary(
    streams: Iterable[Served], allowed: float, backend_tokens: float | None = None
) -> dict[str, object]:
    """Tokens served (prompt + completion of every admitted stream), their ratio to ``allowed``
    (burst + refill x elapsed), the share in answers that ended by themselves, the overshoot
    (served beyond allowed) and how the answers ended."""
    if allowed <= 0:
        raise ValueError("allowed must be > 0")
    served = whole = 0
    ends: dict[str, int] = {}
    for s in streams:
        if s.status != 200:
            continue
        cost = s.prompt_tokens + s.completion_tokens
        served += cost
        end = s.finish_reason or "none"
        ends[end] = ends.get(end, 0) + 1
        if s.finish_reason == "stop":
            whole += cost
    over = max(0.0, served - allowed)
    out: dict[str, object] = {
        "served_tokens": served,
        "served_ratio": round(served / allowed, 4),
        "whole_tokens": whole,
        "whole_share": round(whole / served, 4) if served else None,
        "served_overshoot_tokens": round(over, 1),
        "finish_reasons": dict(sorted(ends.items())),
    }
    if backend_tokens is not None:
        out["backend_overshoot_tokens"] = round(max(0.0, backend_tokens - allowed), 1)
    return out


# the targets of issue 36 for every burst: 0 overshoot, >= 90% served, >= 85% of it whole
SERVED_MIN = 0.90
WHOLE_MIN = 0.85


def burst_targets(b: dict[str, object]) -> dict[str, bool | None]:
    """Which of the three targets one burst's result meets (None: not measured)."""
    ratio, share = b.get("served_ratio"), b.get("whole_share")
    over = b.get("served_overshoot_tokens")
    return {
        "no_overshoot": None if over is None else over == 0,  # type: ignore[comparison-overlap]
        "served": None if ratio is None else float(ratio) >= SERVED_MIN,  # type: ignore[arg-type]
        "whole": None if share is None else float(share) >= WHOLE_MIN,  # type: ignore[arg-type]
    }


def plan_bursts(
    variants: Sequence[str],
    sizes: Sequence[int],
    *,
    warmup: int,
    oversubscribe: float,
    rng: random.Random,
    prompt_tokens: Callable[[str], int],
) -> list[BudgetBurst]:
    """Every (variant, size) burst, its budget such that the burst asks ``oversubscribe`` times
    it: budget = size x (mean real prompt tokens + expected answer) / ``oversubscribe``."""
    if oversubscribe <= 0 or warmup < 0:
        raise ValueError("oversubscribe must be > 0 and warmup >= 0")
    out = []
    for variant in variants:
        history, answers = variant_answers(variant)
        for n in sizes:
            prompts = variant_prompts(variant, rng, n)
            per_request = math.fsum(prompt_tokens(p) for p in prompts) / n + answers.mean_tokens
            burst = max(1, round(n * per_request / oversubscribe))
            out.append(
                BudgetBurst(
                    variant=variant,
                    parallel=n,
                    key=budget_key(variant, n),
                    prompts=tuple(prompts),
                    warmup_prompts=tuple(variant_prompts(variant, rng, warmup)),
                    answers=answers,
                    warmup_answers=history,
                    burst=burst,
                    refill_per_second=round(burst / 60, 3),
                    mean_request_tokens=per_request,
                )
            )
    return out
