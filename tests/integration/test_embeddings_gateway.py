"""``/v1/embeddings`` through `tokenweir up` (examples/mesh.yaml: real Envoy, filter server,
Redis, emulators), with the official ``openai`` client: the gateway checks the body (its own
precise 400s), reserves the prompt and settles ``usage.prompt_tokens``; a batch with
``endpoint: /v1/embeddings`` runs and its output lines carry the embeddings answers."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from openai import OpenAI

from tests.integration.batch_jobs import FINAL, batch_policy, lines_of, wait
from tests.integration.test_e2e_first_contact import call, filters_metrics
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

EP = "/v1/embeddings"
MODEL = "llama-3.1-8b"
KEY = "tw-demo-pro-key"


def prompt_tokens_counted(banner: str) -> float:
    """The filter servers' count of prompt tokens backends reported (settlement)."""
    text = filters_metrics(banner)
    return sum(
        float(v)
        for v in re.findall(
            r'^tokenweir_filters_tokens_total\{[^}]*kind="prompt"[^}]*\} (\S+)$', text, re.M
        )
    )


def emb_lines(n: int) -> bytes:
    rows = [
        {"custom_id": f"e-{i}", "method": "POST", "url": EP,
         "body": {"model": MODEL, "input": [f"document {i} about weirs", f"and {i} more"]}}
        for i in range(n)
    ]  # fmt: skip
    return b"\n".join(json.dumps(r).encode() for r in rows) + b"\n"


def test_embeddings_through_the_gateway_and_the_batch_api(tmp_path: Path) -> None:
    policy, gw = batch_policy(tmp_path)
    proc, banner = start_up(policy, tmp_path / "run", timeout=360)
    base = f"http://127.0.0.1:{gw}/v1"
    client = OpenAI(base_url=base, api_key=KEY, max_retries=0)
    try:
        assert "tokenweir up: ready" in banner, banner
        before = prompt_tokens_counted(banner)
        resp = client.embeddings.create(model=MODEL, input=["weirs hold water", "second text"])
        assert [d.index for d in resp.data] == [0, 1]
        assert all(len(d.embedding) == 256 for d in resp.data)
        assert resp.usage.prompt_tokens == resp.usage.total_tokens > 0
        # settled from the answer's usage.prompt_tokens (no completion_tokens in it)
        end = time.monotonic() + 10
        while prompt_tokens_counted(banner) - before < resp.usage.prompt_tokens:
            assert time.monotonic() < end, filters_metrics(banner)
            time.sleep(0.2)
        assert prompt_tokens_counted(banner) - before == resp.usage.prompt_tokens

        # a hostile body gets the gateway's own precise 400 (OpenAI's error shape), not the
        # backend's; a key it does not know gets 401
        url = base + "/embeddings"
        for body, param in (
            ({"model": MODEL, "input": []}, "input"),
            ({"model": MODEL, "input": ["a", [1, 2]]}, "input"),
            ({"model": MODEL, "input": "x", "dimensions": "8"}, "dimensions"),
            ({"model": MODEL, "input": "x", "frobnicate": 1}, "frobnicate"),
            ({"input": "x"}, "model"),
        ):
            status, _, answer = call(url, KEY, body)
            assert status == 400 and answer["error"]["param"] == param, (body, answer)
        status, _, _ = call(url, "nope", {"model": MODEL, "input": "x"})
        assert status == 401

        # a batch of embeddings lines: validated, run through the batch lane, answered per line
        bad = emb_lines(2).splitlines()
        row = json.loads(bad[1])
        row["body"]["input"] = []
        bad[1] = json.dumps(row).encode()
        f = client.files.create(file=("bad.jsonl", io.BytesIO(b"\n".join(bad))), purpose="batch")
        refused = client.batches.create(input_file_id=f.id, endpoint=EP, completion_window="24h")
        assert refused.status == "failed" and refused.errors is not None
        assert [(e.line, e.param) for e in refused.errors.data or []] == [(2, "body.input")]

        n = 40
        f = client.files.create(file=("emb.jsonl", io.BytesIO(emb_lines(n))), purpose="batch")
        b = client.batches.create(input_file_id=f.id, endpoint=EP, completion_window="24h")
        assert b.endpoint == EP
        b = wait(client, b.id, lambda b: b.status in FINAL)
        assert b.status == "completed" and b.request_counts is not None, b
        assert (b.request_counts.completed, b.request_counts.failed) == (n, 0)
        out = lines_of(client, b.output_file_id)
        assert sorted(str(x["custom_id"]) for x in out) == sorted(f"e-{i}" for i in range(n))
        by_id = {str(x["custom_id"]): x["response"] for x in out}
        first = by_id["e-0"]
        assert first["status_code"] == 200  # type: ignore[index]
        body = first["body"]  # type: ignore[index]
        assert body["object"] == "list" and len(body["data"]) == 2
        assert len(body["data"][0]["embedding"]) == 256 and body["usage"]["prompt_tokens"] > 0
        # the same text gives the same vector, in a batch or not
        again = client.embeddings.create(
            model=MODEL, input=["document 0 about weirs"], encoding_format="float"
        )
        assert again.data[0].embedding == pytest.approx(body["data"][0]["embedding"])
    finally:
        stop_up(proc)
