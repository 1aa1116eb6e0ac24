"""The overload benchmark's client: SSE timing, rejections, Retry-After and the three retry
behaviours, on a small fake HTTP session (no network, no real clock)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from overload_client import Attempt, Behaviour, Client, parse_retry_after
from overload_workload import Arrival

ARRIVAL = Arrival(at=0.0, lane="batch", tenant=1, prompt="a b c", prompt_tokens=3, max_tokens=3)


def sse(*events: object) -> list[bytes]:
    out = []
    for e in events:
        out += [b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n", b"\n"]
    return out


def token(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
FINISH = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
USAGE = {"choices": [], "usage": {"completion_tokens": 3}}
STREAM = sse(ROLE, token("x"), token(" y"), token(" z"), FINISH, USAGE, b"[DONE]")


@dataclass
class FakeResponse:
    status: int
    headers: dict[str, str]
    lines: list[bytes]
    clock: FakeClock
    pause: float = 0.0  # real seconds before each line (patience runs on the loop's clock)

    @property
    def content(self) -> AsyncIterator[bytes]:
        async def gen() -> AsyncIterator[bytes]:
            for line in self.lines:
                if self.pause:
                    await asyncio.sleep(self.pause)
                self.clock.now += 0.01
                yield line

        return gen()

    async def read(self) -> bytes:
        return b"".join(self.lines)

    async def __aenter__(self) -> FakeResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


@dataclass
class FakeClock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeSession:
    """Answers each POST with the next scripted (status, headers, lines)."""

    clock: FakeClock
    script: list[tuple[int, dict[str, str], list[bytes]]]
    sent: list[dict[str, object]] = field(default_factory=list)
    pause: float = 0.0

    def post(self, url: str, *, json: dict[str, object], headers: dict[str, str]) -> FakeResponse:
        self.sent.append({"url": url, "json": json, "headers": headers, "at": self.clock.now})
        status, hdrs, lines = self.script.pop(0)
        self.clock.now += 0.002
        return FakeResponse(status, hdrs, lines, self.clock, self.pause)


def shed(headers: dict[str, str]) -> tuple[int, dict[str, str], list[bytes]]:
    body = json.dumps({"error": {"code": "queue_full", "message": "full"}}).encode()
    return 503, headers, [body]


def make(script: list, behaviour: Behaviour) -> tuple[Client, FakeSession, list[float]]:  # type: ignore[type-arg]
    clock = FakeClock()
    session = FakeSession(clock, script)
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        clock.now += s

    client = Client(
        session,  # type: ignore[arg-type]
        "http://gw/v1/chat/completions", model="m",
        keys={"batch": ["k0", "k1"]}, patience={"batch": 30.0, "interactive": 5.0},
        behaviour=behaviour, clock=clock, rng=random.Random(3), sleep=sleep,
    )  # fmt: skip
    client.start()
    return client, session, slept


def test_retry_after_ms_wins_over_retry_after_seconds() -> None:
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "2"}) == 1.5
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert parse_retry_after({"retry-after-ms": "x", "retry-after": "1"}) == 1.0
    assert parse_retry_after({}) is None


async def test_a_stream_is_timed_per_token_and_ok_only_with_finish_and_done() -> None:
    client, session, _ = make([(200, {}, STREAM)], Behaviour("honour"))
    await client.run(0, ARRIVAL)
    (a,) = client.attempts
    assert a.ok and a.status == 200 and a.tokens == 3 and a.error == ""
    assert a.first_token is not None and a.first_token < a.token_times[-1]
    assert len(a.token_times) == 3 and a.token_times == sorted(a.token_times)
    sent = session.sent[0]
    assert sent["headers"] == {"authorization": "Bearer k1"}  # tenant 1 of the batch lane
    body = sent["json"]
    assert isinstance(body, dict) and body["stream"] is True and body["max_tokens"] == 3


async def test_a_stream_records_its_finish_reason_and_usage_and_sends_extras() -> None:
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, "x": "y"}}
    client, session, _ = make([(200, {}, sse(ROLE, token("x"), stop, usage, b"[DONE]"))],
                              Behaviour("none"))  # fmt: skip
    client.body_extra = {"ignore_eos": False, "stop": ["w"]}
    client.extra_headers = {"x-peers-budget": "1"}
    await client.run(0, ARRIVAL)
    (a,) = client.attempts
    assert a.ok and a.finish_reason == "stop"
    assert a.usage == {"prompt_tokens": 7, "completion_tokens": 2}
    sent = session.sent[0]
    assert sent["headers"] == {"x-peers-budget": "1", "authorization": "Bearer k1"}
    body = sent["json"]
    assert isinstance(body, dict) and body["ignore_eos"] is False and body["stop"] == ["w"]
    # the default stream: cut by max_tokens, usage without a prompt count
    client, _, _ = make([(200, {}, STREAM)], Behaviour("none"))
    await client.run(0, ARRIVAL)
    assert client.attempts[0].finish_reason == "length"
    assert client.attempts[0].usage == {"completion_tokens": 3}


async def test_a_stream_without_done_or_with_an_error_event_is_not_a_success() -> None:
    cut = sse(ROLE, token("x"), FINISH)  # no [DONE]: the connection ended early
    aborted = sse(
        ROLE, token("x"), {"choices": [{"index": 0, "delta": {}, "finish_reason": "abort"}]}
    )
    error = sse(token("x"), {"error": {"message": "retracted"}}, b"[DONE]")
    for lines in (cut, aborted, error):
        client, _, _ = make([(200, {}, lines)], Behaviour("honour"))
        await client.run(0, ARRIVAL)
        (a,) = client.attempts
        assert not a.ok and a.error == "stream" and a.tokens == 1
        assert not a.rejected  # it got a token: a failure, not a rejection


async def test_honouring_clients_wait_as_told_plus_jitter_then_retry() -> None:
    script = [shed({"retry-after": "2"}), shed({"retry-after-ms": "500"}), (200, {}, STREAM)]
    client, session, slept = make(script, Behaviour("honour", max_attempts=4, jitter=0.25))
    await client.run(0, ARRIVAL)
    first, second, third = client.attempts
    assert first.rejected and first.retry_after == 2.0 and first.error == "queue_full"
    assert 2.0 <= slept[0] <= 2.5 and 0.5 <= slept[1] <= 0.625  # never earlier than told
    assert second.told_to_wait == 2.0 and third.told_to_wait == 0.5
    assert third.ok and third.admitted and [a.number for a in client.attempts] == [1, 2, 3]
    assert float(session.sent[1]["at"]) - float(session.sent[0]["at"]) >= 2.0  # type: ignore[arg-type]


async def test_a_capped_wait_comes_back_before_a_far_retry_after() -> None:
    script = [shed({"retry-after": "10"}), shed({"retry-after-ms": "300"}), (200, {}, STREAM)]
    client, _, slept = make(script, Behaviour("honour", max_attempts=4, max_wait=1.0))
    await client.run(0, ARRIVAL)
    assert slept[0] == 1.0 and 0.3 <= slept[1] <= 0.375  # a short one is honoured in full
    assert [a.told_to_wait for a in client.attempts] == [None, 10.0, 0.3]
    b = Behaviour("honour", retry_untold=True, backoff_base=8.0, max_wait=0.5)
    client, _, slept = make([shed({}), (200, {}, STREAM)], b)
    await client.run(0, ARRIVAL)
    assert len(client.attempts) == 2 and 0.0 <= slept[0] <= 0.5  # a back-off too
    with pytest.raises(ValueError, match="max_wait"):
        Behaviour("honour", max_wait=0.0)


async def test_honouring_clients_not_told_give_up_unless_told_to_back_off() -> None:
    client, _, slept = make([shed({}), (200, {}, STREAM)], Behaviour("honour"))
    await client.run(0, ARRIVAL)
    assert len(client.attempts) == 1 and slept == []
    b = Behaviour("honour", retry_untold=True, backoff_base=1.0)
    client, _, slept = make([shed({}), (200, {}, STREAM)], b)
    await client.run(0, ARRIVAL)
    assert len(client.attempts) == 2 and 0.0 <= slept[0] <= 1.0
    assert client.attempts[1].told_to_wait is None  # a back-off is not a Retry-After honoured


async def test_immediate_clients_retry_at_once_and_stop_at_max_attempts() -> None:
    script = [shed({"retry-after": "5"})] * 5
    client, _, slept = make(list(script), Behaviour("immediate", max_attempts=5))
    await client.run(0, ARRIVAL)
    assert len(client.attempts) == 5 and slept == []
    assert all(a.told_to_wait is None for a in client.attempts)


async def test_clients_that_never_retry() -> None:
    client, _, _ = make([shed({"retry-after": "1"})], Behaviour("none"))
    await client.run(0, ARRIVAL)
    assert len(client.attempts) == 1


async def test_an_arrival_waits_for_its_time_and_waiting_counts_in_flight() -> None:
    client, _, slept = make([(200, {}, STREAM)], Behaviour("honour"))
    later = Arrival(at=4.0, lane="batch", tenant=0, prompt="a", prompt_tokens=1, max_tokens=1)
    await client.run(0, later)
    assert slept == [4.0] and client.attempts[0].sent == pytest.approx(4.0)
    assert client.waiting() == {"interactive": 0, "batch": 0}


def test_behaviour_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Behaviour("sometimes")
    with pytest.raises(ValueError):
        Behaviour("honour", max_attempts=0)
    assert Attempt(0, "batch", 1, 0.0, status=429).rejected


async def test_patience_covers_the_first_token_only_a_started_stream_is_read_to_its_end() -> None:
    """Patience 0.2 s: a stream whose first token comes at ~0.04 s and whose end comes after
    ~0.3 s is a success; one whose first token would come after 0.2 s is abandoned."""
    client, session, _ = make([(200, {}, STREAM)], Behaviour("none"))
    client.patience = {"batch": 0.2, "interactive": 0.2}
    session.pause = 0.04  # 8 SSE lines: the first token at the 4th line, [DONE] after ~0.6 s
    await client.run(0, ARRIVAL)
    (a,) = client.attempts
    assert a.ok and a.error == "" and a.tokens == 3
    slow = sse(ROLE, ROLE, ROLE, token("x"), FINISH, b"[DONE]")  # 6 lines before the token
    client, session, _ = make([(200, {}, slow)], Behaviour("none"))
    client.patience = {"batch": 0.2, "interactive": 0.2}
    session.pause = 0.05  # the first token would come at ~0.35 s
    await client.run(0, ARRIVAL)
    (a,) = client.attempts
    assert not a.ok and a.error == "abandoned" and a.first_token is None
