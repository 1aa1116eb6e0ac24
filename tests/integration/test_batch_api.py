"""The OpenAI Batch API through `tokenweir up` (issue 41), with the official `openai` client:
upload, create, progress, an invalid file, cancel, output and error files, a runner and a
filter server each killed mid-job (no line lost, none run twice at the backend but those in
flight at the kill), and a restart of `up` mid-job."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from openai import OpenAI

from tests.integration.batch_jobs import EP, FINAL, batch_policy, chat_lines, lines_of, submit, wait
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]


def jsonl(n: int, prefix: str, max_tokens: int = 16) -> bytes:
    return chat_lines(
        n, prefix, model="llama-3.1-8b", max_tokens=max_tokens, content="line {i} of {prefix}"
    )


def finished_at_backend(banner: str) -> int:
    """Requests every emulated replica finished (the emulator's own counter; the fallback pool
    included), read again until it holds still (it counts a request after its last byte)."""
    last = -1
    for _ in range(20):
        now = _finished_once(banner)
        if now == last:
            return now
        last = now
        time.sleep(0.25)
    return last


def _finished_once(banner: str) -> int:
    total = 0
    for url in re.findall(r"emulator +\S+#\d+ \S+ \(metrics (\S+)\)", banner):
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        total += sum(
            int(float(v))
            for v in re.findall(r"^sglang:num_requests_total\{[^}]*\} (\S+)$", text, re.M)
        )
    return total


def runner_inflight(banner: str) -> int:
    m = re.search(r"batch runner#0 +metrics (\S+)", banner)
    assert m is not None, banner
    with urllib.request.urlopen(m.group(1), timeout=10) as r:
        text = r.read().decode()
    got = re.search(r"^tokenweir_batch_inflight (\S+)$", text, re.M)
    assert got is not None
    return int(float(got.group(1)))


def runner_pid(banner: str) -> int:
    m = re.search(r"batch runner#0 .* pid (\d+)", banner)
    assert m is not None, banner
    return int(m.group(1))


def test_batch_api_end_to_end(tmp_path: Path) -> None:
    policy, gw = batch_policy(tmp_path)
    proc, banner = start_up(policy, tmp_path / "run1", timeout=360)
    client = OpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key="tw-demo-pro-key", max_retries=0)
    try:
        assert "tokenweir up: ready" in banner, banner
        # the same keys as chat traffic: an unknown key is refused by the gateway
        stranger = OpenAI(base_url=f"http://127.0.0.1:{gw}/v1", api_key="nope", max_retries=0)
        with pytest.raises(Exception) as refused:
            stranger.batches.list()
        assert getattr(refused.value, "status_code", None) == 401

        # an invalid file: the batch fails, each problem names its line
        bad = jsonl(3, "bad").splitlines()
        bad[1] = b"{not json"
        row = json.loads(bad[2])
        row["body"]["model"] = "gpt-unknown"
        bad[2] = json.dumps(row).encode()
        bid = submit_raw = client.batches.create(
            input_file_id=client.files.create(
                file=("bad.jsonl", io.BytesIO(b"\n".join(bad))), purpose="batch"
            ).id,
            endpoint=EP, completion_window="24h",
        )  # fmt: skip
        assert submit_raw.status == "failed" and submit_raw.errors is not None
        assert [(e.line, e.code) for e in submit_raw.errors.data or []] == [
            (2, "invalid_json_line"),
            (3, "model_not_found"),
        ]
        assert bid.request_counts is not None and bid.request_counts.total == 0

        # a job runs to completion; a runner killed mid-job loses no line and runs none twice
        before = finished_at_backend(banner)
        n = 150
        bid_ok = submit(client, jsonl(n, "ok"))
        b = wait(client, bid_ok, lambda b: b.request_counts.completed >= 10)
        assert b.status == "in_progress" and b.in_progress_at is not None
        inflight = runner_inflight(banner)
        os.kill(runner_pid(banner), signal.SIGKILL)
        killed_at = client.batches.retrieve(bid_ok).request_counts
        assert killed_at is not None and killed_at.completed < n, "the job ended before the kill"
        b = wait(client, bid_ok, lambda b: b.status in FINAL)
        assert b.status == "completed", b
        assert b.request_counts is not None
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (
            n,
            n,
            0,
        )
        out = lines_of(client, b.output_file_id)
        assert b.error_file_id is None
        assert Counter(str(x["custom_id"]) for x in out) == Counter(f"ok-{i}" for i in range(n))
        assert all(x["response"]["status_code"] == 200 for x in out)  # type: ignore[index]
        assert out[0]["response"]["body"]["object"] == "chat.completion"  # type: ignore[index]
        # each line ran once, but for those in flight at the kill: a backend that finishes a
        # request whose client is gone (the emulator; SGLang aborts it) ran those twice
        assert n <= finished_at_backend(banner) - before <= n + inflight

        # a filter server killed mid-job: lines answered 500 meanwhile are sent again later
        before = finished_at_backend(banner)
        bid_f = submit(client, jsonl(n, "f"))
        wait(client, bid_f, lambda b: b.request_counts.completed >= 10)
        inflight = runner_inflight(banner)
        m_f = re.search(r"filters +grpc://\S+ .*pid (\d+)", banner)
        assert m_f is not None, banner
        os.kill(int(m_f.group(1)), signal.SIGKILL)
        f = wait(client, bid_f, lambda b: b.status in FINAL)
        assert f.status == "completed" and f.request_counts is not None
        assert (f.request_counts.completed, f.request_counts.failed) == (n, 0), f
        out = lines_of(client, f.output_file_id)
        assert Counter(str(x["custom_id"]) for x in out) == Counter(f"f-{i}" for i in range(n))
        assert n <= finished_at_backend(banner) - before <= n + inflight

        # cancel: the job stops, partial output; the lines not run are in the error file
        m = 600
        bid_c = submit(client, jsonl(m, "c", max_tokens=64))
        wait(client, bid_c, lambda b: b.request_counts.completed >= 5)
        c = client.batches.cancel(bid_c)
        assert c.status in ("cancelling", "cancelled") and c.cancelling_at is not None
        c = wait(client, bid_c, lambda b: b.status in FINAL)
        assert c.status == "cancelled" and c.cancelled_at is not None
        assert c.request_counts is not None and 5 <= c.request_counts.completed < m
        done = lines_of(client, c.output_file_id)
        errs = lines_of(client, c.error_file_id)
        assert len(done) == c.request_counts.completed
        assert {e["error"]["code"] for e in errs} == {"batch_cancelled"}  # type: ignore[index]
        ids = Counter(str(x["custom_id"]) for x in done + errs)
        assert ids == Counter(f"c-{i}" for i in range(m))
        listed = client.batches.list(limit=10)
        assert {bid_c, bid_ok} <= {x.id for x in listed.data}

        # a job survives a restart of `up` (state kept in the policy's state folder)
        k = 300
        bid_r = submit(client, jsonl(k, "r", max_tokens=32))
        wait(client, bid_r, lambda b: b.request_counts.completed >= 5)
    finally:
        stop_up(proc)
    proc, banner = start_up(policy, tmp_path / "run2", timeout=360)
    try:
        assert "tokenweir up: ready" in banner, banner
        r = wait(client, bid_r, lambda b: b.status in FINAL)
        assert r.status == "completed" and r.request_counts is not None
        assert (r.request_counts.completed, r.request_counts.failed) == (k, 0)
        out = lines_of(client, r.output_file_id)
        assert Counter(str(x["custom_id"]) for x in out) == Counter(f"r-{i}" for i in range(k))
    finally:
        stop_up(proc)
