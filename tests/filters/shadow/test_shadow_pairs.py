"""The shadow pair book, the usage scanner and the pure summary (no sockets)."""

from __future__ import annotations

import json

import pytest

from filters.plugins.shadow.book import Book
from filters.plugins.shadow.scan import UsageScan
from runtime.shadow import Pair, Side, decode_pair, judge, summarize


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def book(clock: Clock, done: list[Pair]) -> Book:
    return Book(clock, lambda: 1e9, lambda pair, _p: done.append(pair), grace=2.0)


def opened(b: Book) -> str:
    pid = b.open("llm", "rid-1", ("127.0.0.1:1",), timeout=10.0, keep=5, ttl=60.0)
    assert pid is not None
    return pid


OK = Side(200, 0.01, 0.1, 20)


def test_both_sides_make_one_pair_in_either_order() -> None:
    clock, done = Clock(), []
    b = book(clock, done)
    a, c = opened(b), opened(b)
    assert b.claim(a) is not None and b.claim(a) is None  # a mirror is taken once
    b.shadow(a, Side(200, 0.02, 0.3, 20))
    b.primary(a, OK, reached=True)
    b.primary(c, OK, reached=True)
    assert b.claim(c) is not None
    b.shadow(c, Side(error="timeout"))
    assert [p.id for p in done] == [a, c] and len(b) == 0
    assert done[0].request_id == "rid-1" and done[1].shadow.error == "timeout"


def test_a_mirror_that_never_came_is_an_absent_shadow_only_if_the_primary_reached_the_pool() -> (
    None
):
    clock, done = Clock(), []
    b = book(clock, done)
    reached, refused = opened(b), opened(b)
    b.primary(reached, OK, reached=True)
    b.primary(refused, Side(429, None, 0.001, None, "status"), reached=False)
    clock.now += 1.0
    b.sweep()
    assert done == [] and len(b) == 2  # within the grace the mirror may still arrive
    clock.now += 1.5
    b.sweep()
    assert [(p.id, p.shadow.error) for p in done] == [(reached, "absent")]
    assert len(b) == 0 and b.dropped == 1  # the refused one was never mirrored


def test_stale_pairs_are_dropped_and_the_book_is_bounded() -> None:
    clock, done = Clock(), []
    b = Book(clock, lambda: 0.0, lambda pair, _p: done.append(pair), max_open=2)
    a = opened(b)
    opened(b)
    assert b.open("llm", "", ("h:1",), timeout=1, keep=1, ttl=1) is None
    assert b.open("llm", "", (), timeout=1, keep=1, ttl=1) is None
    b.claim(a)  # attached, never finished by either side
    clock.now += 2 * 10.0 + 2.0 + 0.1
    b.sweep()
    assert len(b) == 0 and b.dropped == 2 and done == []


def test_judge_names_the_first_failure() -> None:
    assert judge(200, True, 5, None, 0.1, 0.2).ok
    assert judge(500, True, 5, None, 0.1, 0.2).error == "status"
    assert judge(200, False, 5, None, 0.1, 0.2).error == "cut"
    assert judge(200, True, 0, None, 0.1, 0.2).error == "no_output"
    assert judge(0, False, None, "connect", None, 0.2).error == "connect"


def test_usage_scan_reads_sse_json_and_generate_answers_in_pieces() -> None:
    sse = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
           b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}\n\ndata: [DONE]\n\n')  # fmt: skip
    s = UsageScan("text/event-stream")
    for i in range(0, len(sse), 5):
        s.feed(sse[i : i + 5])
    assert s.done() == 7
    body = json.dumps({"usage": {"prompt_tokens": 1, "completion_tokens": 4}}).encode()
    j = UsageScan("application/json")
    j.feed(body[:9])
    j.feed(body[9:])
    assert j.done() == 4
    big = UsageScan("application/json", max_json=8)
    big.feed(body)
    assert big.done() is None and big.overflow
    gen = UsageScan("text/event-stream")
    for n in (1, 2, 3):
        gen.feed(b'data: {"text":"x","meta_info":{"completion_tokens":%d}}\n\n' % n)
    assert gen.done() == 3


def test_summary_and_round_trip() -> None:
    pairs = [
        Pair("a", "llm", "r1", 1.0, Side(200, 0.01, 0.1, 20), Side(200, 0.02, 0.3, 20)),
        Pair("b", "llm", "r2", 2.0, Side(200, 0.01, 0.2, 20), Side(200, 0.02, 0.2, 18)),
        Pair("c", "llm", "r3", 3.0, Side(200, 0.01, 0.1, 20), Side(error="absent")),
    ]
    assert [decode_pair(p.encode()) for p in pairs] == pairs
    s = summarize(pairs)
    assert s["pairs"] == 3 and s["both_ok"] == 2 and s["same_output_tokens"] == 1
    assert s["latency_ratio_p50"] == 1.0  # ratios 3.0 and 1.0: the lower middle
    assert s["shadow"]["errors_by_kind"] == {"absent": 1} and s["primary"]["errors"] == 0
    assert s["shadow"]["completion_tokens_mean"] == 19.0


def test_a_side_whose_time_is_not_a_number_is_not_a_shadow_pair() -> None:
    good = json.loads(Pair("a", "llm", "r1", 1.0, Side(200, 0.01, 0.1, 20), Side()).encode())
    assert decode_pair(json.dumps(good)).primary.latency_s == 0.1
    for bad in ([0.1], {"s": 0.1}):
        good["primary"]["latency_s"] = bad
        with pytest.raises(ValueError, match=r"not a shadow pair: float\(\) argument must be"):
            decode_pair(json.dumps(good))
