"""The prompt side of a reservation never under-counts a real byte-level BPE (issue 36).

The oracle: a byte-level BPE ``tokenizer.json`` trained by the ``tokenizers`` library with Llama
3's pre-tokenizer and chat template (tests/chat_model.py), applied as SGLang applies it
(chat/tokenizer.py: the template rendered, then encoded). Its vocabulary is small, so
unusual text costs nearly a token per byte: the harshest real tokenizer a bound can meet.
The bound: :func:`filters.plugins.tokens.plugin.estimate_prompt` with the estimator the filter server
uses without a tokenizer file (:class:`filters.estimate.ByteBound`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.tokenizer import HfChatTokenizer
from filters.bodies import parse_request
from filters.estimate import ByteBound, HeuristicEstimator
from filters.plugins.tokens.plugin import estimate_prompt
from filters.services import Services
from tests.chat_model import make_model_dir
from tests.filters.conftest import FakeClock, make_services

pytest.importorskip("tokenizers")

_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> HfChatTokenizer:
    return HfChatTokenizer.load(make_model_dir(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def services() -> Services:
    from policy import load_policy

    return make_services(load_policy(_ROOT / "examples" / "mesh.yaml"), FakeClock())


_CHARS = st.characters(blacklist_categories=("Cs",))  # a lone surrogate is not UTF-8
# pieces that real tokenizers charge many tokens per character or per byte
_HARD = st.sampled_from([
    "日本語のテキスト", "中文文本", "한국어", "😀", "👩‍👩‍👧‍👦", "🇺🇳", "é", "\u0301", "ﷺ",
    "{", "}", "=>", " ; ", " ( ", " ) ", " . ", " , ", "!=", "&&", "::", "#", "@", "~`",
    "0" * 37, "1234567890", "3.14159", " 42 ", "\n", "\n\n", "\t", "   ", "\r\n",
    "x", "qz", "Zj", " a", "<|eot_id|>", "<|start_header_id|>", "'s", "'ll",
])  # fmt: skip
_TEXT = st.one_of(
    st.text(_CHARS, max_size=300),
    st.lists(_HARD, max_size=120).map("".join),
    st.lists(st.one_of(_HARD, st.text(_CHARS, max_size=8)), max_size=60).map(" ".join),
)
_ROLES = st.sampled_from(["system", "user", "assistant", "user", "tool", "developer"])


def _bound(services: Services, body: dict[str, object], kind: str = "chat") -> int:
    req = parse_request(kind, json.dumps(body).encode())  # type: ignore[arg-type]
    return estimate_prompt(req, services)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(st.tuples(_ROLES, _TEXT), min_size=1, max_size=5))
def test_chat_prompts_are_never_under_counted(
    model: HfChatTokenizer, services: Services, messages: list[tuple[str, str]]
) -> None:
    body = {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}
    real = len(model.encode(model.render_request(body)))
    assert _bound(services, body) >= real


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=_TEXT)
def test_plain_prompts_are_never_under_counted(
    model: HfChatTokenizer, services: Services, prompt: str
) -> None:
    real = len(model.encode(model.plain_prompt(prompt)))
    assert _bound(services, {"model": "m", "prompt": prompt}, "completion") >= real


def _crafted(cheap_chars: int, dear: str, repeats: int) -> str:
    """A prompt laid out against a sampler: cheap words everywhere a window of 256 characters
    every 1/64 of the text would look, and the expensive text between them."""
    out = []
    for _ in range(64):
        out.append("a " * (cheap_chars // 2))
        out.append(dear * repeats)
    return "".join(out)


@pytest.mark.parametrize("dear", ["中文", "😀", "{}", " ; ", "0" * 40, "\n\t"])
def test_a_prompt_crafted_against_sampling_is_bounded(
    model: HfChatTokenizer, services: Services, dear: str
) -> None:
    prompt = _crafted(256, dear, 300)
    assert len(prompt) > 16_384  # what the sampler of the old estimator took samples of
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}
    real = len(model.encode(model.render_request(body)))
    bound = _bound(services, body)
    assert real <= bound <= len(prompt.encode()) + 100  # and no more than its bytes
    # the typical-count heuristic is not a bound: it is why reservations no longer use it
    if dear in ("中文", "😀", " ; "):
        assert HeuristicEstimator().count(prompt) < real


def test_tools_are_counted(model: HfChatTokenizer, services: Services) -> None:
    tools = [{"type": "function", "function": {"name": "f" * 50, "description": "日本" * 200,
              "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    without = _bound(services, {"model": "m", "messages": body["messages"]})
    assert _bound(services, body) >= without + len(json.dumps(tools, ensure_ascii=False).encode())


def test_the_bound_is_the_bytes_whatever_their_script() -> None:
    b = ByteBound()
    for text in ("hello world", "日本語", "😀😀", "a\u0301", "x" * 100_000):
        assert b.count(text) == len(text.encode())
