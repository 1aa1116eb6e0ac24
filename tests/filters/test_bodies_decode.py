"""The body's decode: msgspec first, the standard library's reading for what msgspec refuses.
Every body must get exactly the answer the standard library's reading gives (the value, or the
same error with the same message)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from filters.bodies import _decode_checked, decode_json
from filters.errors import ClientError


def outcome(fn: Any, body: bytes) -> tuple[str, Any]:
    try:
        value = fn(body)
    except ClientError as exc:
        return ("error", (exc.status, exc.message, exc.reason))
    return ("value", json.dumps(value, sort_keys=True, default=repr, allow_nan=True))


def same(body: bytes) -> None:
    assert outcome(decode_json, body) == outcome(_decode_checked, body), body[:200]


TRICKY = [
    b"",
    b"   ",
    b"[]",
    b'"text"',
    b"null",
    b'{"a": NaN}',
    b'{"a": -Infinity}',
    b'{"a": 1e400}',
    b'{"a": 123456789012345678901234567890}',
    b'{"a": -0}',
    b'{"a": 0.1}',
    b'{"a": 1.7976931348623157e308}',
    b'{"a": 5e-324}',
    b'{"a":"\\ud800"}',
    b'{"a":"\\udc00"}',
    b'{"a":"\\ud800x"}',
    b'{"\\ud800":1}',
    b'{"a":"\\ud83d\\ude00"}',
    b'{"a":"\\\\ud800"}',
    b'{"a":1,"a":2}',
    b'\xff{"a":1}',
    b'{"a":"\xc3"}',
    b'\xef\xbb\xbf{"a":1}',
    b'{"a":1} x',
    b'{"a":"\x01"}',
    b'{"a":01}',
    b'{"a":"caf\xc3\xa9 \\u00e9 \\u2014"}',
    b"[" * 5000 + b"]" * 5000,
    b'{"a":' * 5000 + b"1" + b"}" * 5000,
]


def test_tricky_bodies_get_the_standard_librarys_answer() -> None:
    for body in TRICKY:
        same(body)


def test_a_long_escaped_prompt_is_decoded() -> None:
    text = "weir — a low dam; ≤ 3 ms × 300 KB. " * 8000
    for ascii_only in (True, False):
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": text}]},
            ensure_ascii=ascii_only,
        ).encode()
        assert decode_json(body)["messages"][0]["content"] == text
        same(body)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, ascii_only=st.booleans())
def test_any_json_value_gets_the_standard_librarys_answer(value: Any, ascii_only: bool) -> None:
    same(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))
    same(json.dumps({"v": value}, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@settings(max_examples=300, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    cut=st.integers(min_value=0, max_value=400),
    insert=st.binary(max_size=3),
)
def test_damaged_bodies_get_the_standard_librarys_answer(
    value: dict[str, Any], cut: int, insert: bytes
) -> None:
    body = json.dumps(value).encode()
    cut = min(cut, len(body))
    same(body[:cut] + insert + body[cut:])
    same(body[:cut])


def test_nan_in_the_standard_librarys_reading_is_still_refused() -> None:
    kind, (status, message, reason) = outcome(decode_json, b'{"max_tokens": NaN}')
    assert kind == "error" and status == 400 and reason == "bad_json" and "NaN" in message
