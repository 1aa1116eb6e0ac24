"""chat.tokenizer: a model's tokenizer and chat template, and tokenizing piece by piece."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.tokenizer import (
    ChatTemplateError,
    HfChatTokenizer,
    TokenizerFilesError,
    byte_decoder,
    sglang_tools,
)
from tests.chat_model import SPECIALS, make_model_dir

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> HfChatTokenizer:
    return HfChatTokenizer.load(make_model_dir(tmp_path_factory.mktemp("model")))


def test_renders_llama3_prompts_as_the_format_is_documented(model: HfChatTokenizer) -> None:
    msgs = [
        {"role": "system", "content": "Be brief. ", "name": None},
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]},
    ]  # fmt: skip
    assert model.render_chat(msgs) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhello world<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = model.encode(model.render_chat(msgs))
    assert ids[0] == model.tokenizer.token_to_id("<|begin_of_text|>")
    assert ids.count(model.tokenizer.token_to_id("<|eot_id|>")) == 2


def test_plain_prompts_start_with_the_tokens_the_tokenizer_adds(model: HfChatTokenizer) -> None:
    text = "hello world, it's 2024"
    assert model.lead == "<|begin_of_text|>"
    assert model.encode(model.plain_prompt(text)) == model.tokenizer.encode(text).ids


def test_templates_that_iterate_content_get_the_parts(tmp_path: Path) -> None:
    template = (
        "{% for message in messages %}{{ message['role'] }}:{% for part in message['content'] %}"
        "[{{ part['text'] }}]{% endfor %}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    model = HfChatTokenizer.load(make_model_dir(tmp_path / "m", template=template))
    assert model.content_as_list
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]
    assert model.render_chat(msgs) == "user:[a][b]A:"  # trim_blocks ate the newline


_TOOL = {"name": "look", "description": "a<b & 'c' über", "parameters": {"type": "object"}}


def test_tools_reach_the_template_as_sglang_hands_them_over(tmp_path: Path) -> None:
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": _TOOL},
                  {"type": "function", "function": {"name": "other", "strict": True}}],
    }  # fmt: skip
    dumped = {"description": _TOOL["description"], "name": "look",
              "parameters": {"type": "object"}, "strict": False}  # fmt: skip
    other = {"description": None, "name": "other", "parameters": None, "strict": True}
    assert sglang_tools(body) == [dumped, other]
    named = {**body, "tool_choice": {"type": "function", "function": {"name": "look"}}}
    assert sglang_tools(named) == [dumped]
    assert sglang_tools({**body, "tool_choice": "none"}) is None
    assert sglang_tools({"messages": []}) is None
    # transformers' tojson: no HTML escaping, non-ASCII kept, keys in order
    template = "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{{ messages[0]['content'] }}"
    model = HfChatTokenizer.load(make_model_dir(tmp_path / "t", template=template))
    text = model.render_request(named)
    assert text == json.dumps(dumped, ensure_ascii=False) + "\nx"


def test_template_errors_are_named(tmp_path: Path, model: HfChatTokenizer) -> None:
    with pytest.raises(ChatTemplateError, match="list of objects"):
        model.render_chat("hello")
    raising = "{{ raise_exception('roles must alternate') }}"
    other = HfChatTokenizer.load(make_model_dir(tmp_path / "r", template=raising))
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        other.render_chat([{"role": "user", "content": "x"}])
    bare = HfChatTokenizer.load(make_model_dir(tmp_path / "n", template=None))
    assert not bare.has_chat_template
    with pytest.raises(ChatTemplateError, match="no chat template"):
        bare.render_chat([{"role": "user", "content": "x"}])


def test_bad_model_directories_are_refused_with_the_file_and_reason(tmp_path: Path) -> None:
    with pytest.raises(TokenizerFilesError, match=r"tokenizer\.json"):
        HfChatTokenizer.load(tmp_path / "nowhere")
    from tokenizers import Tokenizer, models, pre_tokenizers

    spm = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    spm.pre_tokenizer = pre_tokenizers.Metaspace()
    (tmp_path / "spm").mkdir()
    spm.save(str(tmp_path / "spm" / "tokenizer.json"))
    with pytest.raises(TokenizerFilesError, match="not byte-level"):
        HfChatTokenizer.load(tmp_path / "spm")
    good = make_model_dir(tmp_path / "t")
    (good / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for %}"}))
    with pytest.raises(TokenizerFilesError, match="does not compile"):
        HfChatTokenizer.load(good)


def test_text_the_tokenizer_cannot_take_is_a_named_error(model: HfChatTokenizer) -> None:
    with pytest.raises(ChatTemplateError, match="cannot encode"):
        model.encode("a \ud800 b")


def test_byte_alphabet_covers_every_byte_once() -> None:
    dec = byte_decoder()
    assert sorted(dec.values()) == list(range(256))
    assert dec["!"] == ord("!") and dec["Ġ"] == ord(" ") and dec["Ċ"] == ord("\n")


_ALPHABET = st.sampled_from(
    ["a", "b", "Z", " ", "  ", "\n", "\n\n", "\t", "1", "23", "'", "'s", "'ll", ",", "!!", "é",
     "ü", "→", "“", "日本", "{", "}", "_", "-", *SPECIALS, "<|", "eot", "|>"]
)  # fmt: skip


def _pieces(model: HfChatTokenizer, data: bytes, cuts: list[int]) -> tuple[list[int], int]:
    out: list[int] = []
    pos = 0
    for cut in sorted(set(cuts)):
        if cut <= pos:
            continue
        ids, used = model.stable(data[pos:cut])
        assert used <= cut - pos
        out += ids
        pos += used
    return out, pos


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.lists(_ALPHABET, min_size=0, max_size=60).map("".join),
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
)
def test_piece_by_piece_gives_the_whole_prompts_ids(
    model: HfChatTokenizer, text: str, cuts: list[int]
) -> None:
    data = text.encode()
    whole = model.encode(text)
    ids, used = _pieces(model, data, cuts)
    assert ids == whole[: len(ids)]
    # the bytes covered are exactly those ids' text, and the rest tokenizes to the rest
    assert model.encode(data[used:].decode()) == whole[len(ids) :]


def test_long_text_is_covered_but_for_its_last_pre_tokens(model: HfChatTokenizer) -> None:
    text = "the cat sat on a mat " * 200
    data = text.encode()
    ids, used = _pieces(model, data, [*range(64, len(data), 64), len(data)])
    assert used > len(data) - 16
    assert ids == model.encode(text)[: len(ids)]
