"""``--request-log``: a JSON line per finished request, joinable with the ids the client saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from backends.emulator import EmulatorSettings, start_emulator
from backends.emulator.__main__ import parse_args

pytestmark = pytest.mark.integration


def test_cli_flag_reaches_settings(tmp_path: Path) -> None:
    assert parse_args(["--request-log", str(tmp_path / "r.jsonl")]).request_log == str(
        tmp_path / "r.jsonl"
    )
    assert parse_args([]).request_log is None


async def test_each_answer_has_a_line_with_its_id_and_the_servers_times(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    server = await start_emulator(
        EmulatorSettings(profile="seed-2k", time_scale=0.01, request_log=str(path))
    )
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    prompt = "the same long shared prefix " * 40
    ids: list[str] = []
    try:
        for _ in range(2):  # the second finds the first's prompt in the radix cache
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                ids.append(chunk.id)
        done = await client.completions.create(model="m", prompt="other", max_tokens=2)
        ids.append(done.id)
    finally:
        await client.close()
        await server.aclose()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["rid"] for x in lines] == list(dict.fromkeys(ids))  # one line per answer, in order
    first, second, third = lines
    for x in lines:
        assert 0 <= x["queue_s"] <= x["ttft_s"] <= x["e2e_s"]
        assert x["finish"] == "length"
    assert first["output_tokens"] == second["output_tokens"] == 3
    assert first["prompt_tokens"] == second["prompt_tokens"] > 40
    assert first["cached_tokens"] == 0 < second["cached_tokens"] < second["prompt_tokens"]
    assert third["rid"].startswith("cmpl-") and third["output_tokens"] == 2
