from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.bodies import dump_body, kind_for_path, parse_request
from filters.errors import ClientError


def chat(**kw: object) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}
    return json.dumps(body).encode()


def test_kind_for_path() -> None:
    assert kind_for_path("/v1/chat/completions?x=1") == "chat"
    assert kind_for_path("/v1/completions") == "completion"
    assert kind_for_path("/generate") == "generate"
    assert kind_for_path("/v1/embeddings") == "embedding"
    assert kind_for_path("/v1/models") is None


def test_chat_renders_roles_and_prefix_stops_after_first_user_message() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "first"}]},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "second"},
        ],
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = parse_request("chat", json.dumps(body).encode())
    assert req.model == "m" and req.stream and req.include_usage and req.max_tokens == 20
    assert "second" in req.prompt_text and "answer" in req.prompt_text
    assert req.prefix_text.startswith("<|system|>\nYou are terse.")
    assert "first" in req.prefix_text and "answer" not in req.prefix_text


def test_max_completion_tokens_is_the_field_used() -> None:
    req = parse_request("chat", chat(max_completion_tokens=7))
    assert (req.max_tokens, req.max_tokens_field) == (7, "max_completion_tokens")


@pytest.mark.parametrize(
    ("body", "reason", "param"),
    [
        (b"{not json", "bad_json", None),
        (b"\xff\xfe{}", "bad_utf8", None),
        (b"[1, 2]", "bad_json", None),
        (b'{"model": "m", "messages": [], "x": NaN}', "bad_json", None),
        (b"[" * 100_000 + b"]" * 100_000, "bad_json", None),
        (chat(max_tokens=-5), "bad_field", "max_tokens"),
        (chat(max_tokens=10**12), "bad_field", "max_tokens"),
        (chat(max_tokens="12"), "bad_field", "max_tokens"),
        (chat(max_tokens=True), "bad_field", "max_tokens"),
        (chat(n=2), "n_gt_1", "n"),
        (chat(frobnicate=1), "unknown_field", "frobnicate"),
        (chat(stream="yes"), "bad_field", "stream"),
        (json.dumps({"model": "m", "messages": "hi"}).encode(), "bad_field", "messages"),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(),
            "bad_field",
            "model",
        ),
        (
            json.dumps({"model": "m", "messages": [{"role": "wizard"}]}).encode(),
            "bad_field",
            "messages[0]",
        ),
    ],
)
def test_bad_chat_bodies_are_client_errors(body: bytes, reason: str, param: str | None) -> None:
    with pytest.raises(ClientError) as info:
        parse_request("chat", body)
    assert info.value.status == 400
    assert info.value.reason == reason
    assert info.value.param == param


def test_completion_prompt_forms() -> None:
    ids = parse_request("completion", b'{"model":"m","prompt":[1,2,3]}')
    assert ids.input_ids == (1, 2, 3)
    one = parse_request("completion", b'{"model":"m","prompt":["hello"]}')
    assert one.prompt_text == "hello"
    with pytest.raises(ClientError) as info:
        parse_request("completion", b'{"model":"m","prompt":["a","b"]}')
    assert info.value.reason == "n_gt_1"


def test_embedding_input_forms() -> None:
    one = parse_request("embedding", b'{"model":"m","input":"hello there"}')
    assert (one.kind, one.prompt_text, one.max_tokens, one.stream) == (
        "embedding", "hello there", None, False,
    )  # fmt: skip
    many = parse_request("embedding", b'{"model":"m","input":["a","b"],"dimensions":8}')
    assert many.prompt_text == "a\nb" and many.input_ids is None
    ids = parse_request(
        "embedding", b'{"model":"m","input":[[1,2],[3]],"encoding_format":"base64"}'
    )
    assert ids.input_ids == (1, 2, 3)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"input":"x"}', "model"),
        (b'{"model":"m"}', "input"),
        (b'{"model":"m","input":""}', "input"),
        (b'{"model":"m","input":[]}', "input"),
        (b'{"model":"m","input":{"a":1}}', "input"),
        (b'{"model":"m","input":["a",[1]]}', "input"),
        (b'{"model":"m","input":[[1,-1]]}', "input"),
        (b'{"model":"m","input":"x","dimensions":0}', "dimensions"),
        (b'{"model":"m","input":"x","encoding_format":"int8"}', "encoding_format"),
        (b'{"model":"m","input":"x","max_tokens":3}', "max_tokens"),
    ],
)
def test_bad_embedding_bodies_are_client_errors(body: bytes, param: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_request("embedding", body)
    assert info.value.status == 400 and info.value.param == param


def test_generate_body() -> None:
    req = parse_request("generate", b'{"text":"hi there","sampling_params":{"max_new_tokens":9}}')
    assert (req.model, req.max_tokens, req.include_usage) == (None, 9, True)
    with pytest.raises(ClientError):
        parse_request("generate", b'{"text":"a","input_ids":[1]}')
    with pytest.raises(ClientError):
        parse_request("generate", b'{"text":"a","sampling_params":{"n":3}}')


def test_unknown_fields_can_be_allowed() -> None:
    req = parse_request("chat", chat(my_field=1), extra_fields={"my_field"})
    assert req.data["my_field"] == 1
    assert parse_request("chat", chat(other=1), reject_unknown=False).data["other"] == 1


@pytest.mark.parametrize(
    "content",
    # the last: an escaped backslash, then a real lone surrogate escape
    [b'"\\ud800"', b'"a\\udfffb"', b'"x\\uDBFF"', b'"\\udc00\\ud800"', b'"\\\\\\ud800"'],
)
def test_lone_surrogates_are_rejected(content: bytes) -> None:
    # a backend cannot encode them: SGLang's tokenizer fails with a 500 that ejects the replica
    body = b'{"model":"m","messages":[{"role":"user","content":' + content + b"}]}"
    with pytest.raises(ClientError, match="lone UTF-16 surrogate") as info:
        parse_request("chat", body)
    assert info.value.status == 400 and info.value.reason == "bad_utf8"


def test_surrogate_pairs_and_escaped_backslashes_pass() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"\\ud83d\\ude00 \\\\ud800"}]}'
    req = parse_request("chat", body)
    assert req.data["messages"][0]["content"] == "\U0001f600 \\ud800"
    assert json.loads(dump_body(req.data)) == req.data


def test_text_that_only_mentions_a_surrogate_escape_is_not_walked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "\\ud800" in JSON is the text \ud800: no surrogate can be in the decoded strings, so
    # the whole-body check (a full encode of a long prompt) must not run
    import filters.bodies as bodies

    def boom(data: object) -> None:
        raise AssertionError("walked")

    monkeypatch.setattr(bodies, "_check_surrogates", boom)
    body = b'{"model":"m","messages":[{"role":"user","content":"see \\\\ud800 and \\\\uDFFF"}]}'
    assert parse_request("chat", body).data["messages"][0]["content"] == "see \\ud800 and \\uDFFF"


@pytest.mark.parametrize("body", [b"", b"  \r\n"])
def test_an_empty_body_is_a_400_that_says_so(body: bytes) -> None:
    with pytest.raises(ClientError, match="the request body is empty") as info:
        parse_request("chat", body)
    assert info.value.status == 400


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
fields = st.sampled_from(
    ["model", "messages", "max_tokens", "n", "stream", "stream_options", "prompt", "text",
     "input_ids", "input", "sampling_params", "max_completion_tokens", "temperature", "zzz"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["chat", "completion", "generate", "embedding"]),
    raw=st.binary(max_size=200),
)
def test_fuzz_random_bytes_never_crash(kind: str, raw: bytes) -> None:
    try:
        parse_request(kind, raw)  # type: ignore[arg-type]
    except ClientError as exc:
        assert 400 <= exc.status < 500


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(["chat", "completion", "generate", "embedding"]),
    obj=st.dictionaries(fields, json_values, max_size=6),
)
def test_fuzz_json_objects_parse_or_fail_cleanly(kind: str, obj: dict[str, object]) -> None:
    try:
        req = parse_request(kind, json.dumps(obj).encode())  # type: ignore[arg-type]
    except ClientError as exc:
        assert 400 <= exc.status < 500 and exc.message
        return
    assert req.max_tokens is None or 1 <= req.max_tokens <= 1_000_000
    json.loads(dump_body(req.data))
