"""The README's first-contact calls against `tokenweir up` on examples/mesh.yaml (ports moved to
free ones, emulators sped up): the demo keys work, an unknown key gets 401, a spoofed tenant header
is ignored, the free tenant hits its quota with a 429 and Retry-After, the openai client streams."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.helpers import free_port, free_port_block
from tests.integration.up_process import ROOT, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def example_policy() -> tuple[str, int]:
    text = (ROOT / "examples" / "mesh.yaml").read_text()
    base = free_port_block(3)
    text = re.sub(r"base_port: 30001\b", f"base_port: {base}\n      time_scale: 0.02", text)
    moved: dict[str, int] = {}  # every fixed port of the example, metrics ports included

    def move(m: re.Match[str]) -> str:
        return f"{m.group(1)}{moved.setdefault(m.group(2), free_port())}"

    text = re.sub(r"(127\.0\.0\.1:|metrics_port: )(\d+)", move, text)
    return text, moved["10000"]


def call(url: str, key: str, body: dict[str, object], extra: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json", **(extra or {})},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def test_readme_first_contact(tmp_path: Path) -> None:
    text, gw = example_policy()
    (tmp_path / "mesh.yaml").write_text(text)
    proc, banner = start_up(tmp_path / "mesh.yaml", tmp_path / "run")
    try:
        assert "tokenweir up: ready" in banner, banner
        url = f"http://127.0.0.1:{gw}/v1/chat/completions"
        hello = {
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 32,
        }
        status, _, answer = call(url, "tw-demo-pro-key", hello)
        assert status == 200 and answer["choices"][0]["message"]["content"], answer

        status, _, err = call(url, "not-a-real-key", hello)
        assert status == 401 and err["error"]["code"] == "invalid_api_key"

        spoof = {**hello, "max_tokens": 4000}
        status, _, answer = call(url, "tw-demo-free-key", spoof, {"x-tokenweir-tenant": "demo-pro"})
        assert status == 200 and answer["usage"]["completion_tokens"] <= 256  # the free tier's cap

        with openai.OpenAI(
            base_url=f"http://127.0.0.1:{gw}/v1", api_key="tw-demo-pro-key", max_retries=0
        ) as client:
            stream = client.chat.completions.create(
                model="llama-3.1-8b", messages=[{"role": "user", "content": "Tell me about weirs."}],
                max_tokens=16, stream=True, extra_headers={"x-session-id": "conversation-1"},
            )  # fmt: skip
            text_out = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert text_out.strip()

        story = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Write a long story."}],
                 "max_tokens": 256}  # fmt: skip
        seen = []
        for _ in range(15):
            status, headers, body = call(url, "tw-demo-free-key", story)
            seen.append(status)
            if status == 429:
                assert {k.lower() for k in headers} >= {"retry-after"}
                assert body["error"]["message"]
                break
        assert 429 in seen, seen
    finally:
        stop_up(proc)
