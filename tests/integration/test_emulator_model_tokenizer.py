"""The emulator with ``--tokenizer-path``: prompts rendered and tokenized with a model's files as
SGLang does (prompt token counts are the model's), a template that refuses the messages answered
400, and a directory that cannot be read refused at start with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from backends.emulator import EmulatorSettings, start_emulator
from chat.tokenizer import HfChatTokenizer
from tests.chat_model import make_model_dir

pytestmark = pytest.mark.integration
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")


async def test_prompt_tokens_are_the_models(tmp_path: Path) -> None:
    template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{{ m['content'] }}"
        "<|eot_id|>{% endfor %}<|start_header_id|>assistant<|end_header_id|>"
    )
    model = make_model_dir(tmp_path / "model", template=template)
    tok = HfChatTokenizer.load(model)
    server = await start_emulator(
        EmulatorSettings(profile="seed-2k", time_scale=0.02, tokenizer_path=str(model))
    )
    messages = [{"role": "user", "content": "hello world, it's naïve"}]
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": "m", "messages": messages, "max_tokens": 1}
            async with http.post(f"{server.url}/v1/chat/completions", json=body) as r:
                assert r.status == 200
                usage = (await r.json())["usage"]
            assert usage["prompt_tokens"] == len(tok.encode(tok.render_chat(messages)))
            text = "the cat sat on the mat"
            body2 = {"model": "m", "prompt": text, "max_tokens": 1}
            async with http.post(f"{server.url}/v1/completions", json=body2) as r:
                assert r.status == 200
                usage = (await r.json())["usage"]
            # BOS first, as the tokenizer adds it to a plain prompt
            assert usage["prompt_tokens"] == len(tok.tokenizer.encode(text).ids)
            bad = {"model": "m", "messages": [{"role": "tool", "content": "x"}], "max_tokens": 1}
            async with http.post(f"{server.url}/v1/chat/completions", json=bad) as r:
                assert r.status == 400
                assert "no tools" in (await r.json())["message"]  # SGLang's error object
            lone = b'{"model": "m", "prompt": "a \\ud800 b", "max_tokens": 1}'  # a lone surrogate
            async with http.post(f"{server.url}/v1/completions", data=lone) as r:
                assert r.status == 400  # never a 500
            lone_chat = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
            async with http.post(f"{server.url}/v1/chat/completions", data=lone_chat) as r:
                assert r.status == 400
    finally:
        await server.aclose()


def test_a_bad_directory_is_refused_at_start(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "backends.emulator", "--port", "0", "--profile", "seed-2k"]
    argv += ["--tokenizer-path", str(tmp_path / "missing")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--tokenizer-path" in proc.stderr and "tokenizer.json" in proc.stderr
