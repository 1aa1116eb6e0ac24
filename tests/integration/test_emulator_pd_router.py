"""sglang-router in PD mode (``--pd-disaggregation --prefill URL BOOTSTRAP_PORT --decode URL``)
in front of two emulators, all real processes: the router's bootstrap fields reach both sides,
the decode side's answer streams back, and a dead prefill ends in a JSON error, not a hang."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = pytest.mark.integration

pytest.importorskip("sglang_router")


class _Pd:
    def __init__(self, tmp: Path) -> None:
        self.prefill_port, self.decode_port = free_port(), free_port()
        self.bootstrap_port, self.router_port = free_port(), free_port()
        emu = [sys.executable, "-m", "backends.emulator", "--profile", "seed-2k",
               "--time-scale", "0.05", "--disaggregation-timeout", "5"]  # fmt: skip
        self.prefill = ChildProcess(
            [*emu, "--port", str(self.prefill_port), "--disaggregation-mode", "prefill",
             "--disaggregation-bootstrap-port", str(self.bootstrap_port)],
            log=tmp / "prefill.log",
        )  # fmt: skip
        self.decode = ChildProcess(
            [*emu, "--port", str(self.decode_port), "--disaggregation-mode", "decode"],
            log=tmp / "decode.log",
        )
        for port in (self.prefill_port, self.decode_port, self.bootstrap_port):
            wait_for_port(port, timeout=30)
        self.router = ChildProcess(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
             "--port", str(self.router_port), "--pd-disaggregation",
             "--prefill", f"http://127.0.0.1:{self.prefill_port}", str(self.bootstrap_port),
             "--decode", f"http://127.0.0.1:{self.decode_port}",
             "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1"],
            log=tmp / "router.log",
        )  # fmt: skip
        wait_for_port(self.router_port, timeout=90)
        self.url = f"http://127.0.0.1:{self.router_port}"

    def state(self, port: int) -> dict[str, Any]:
        r = httpx.get(f"http://127.0.0.1:{port}/_emulator/state", timeout=5)
        return r.json()["disaggregation"]  # type: ignore[no-any-return]

    def close(self) -> None:
        for child in (self.router, self.decode, self.prefill):
            child.close()


@pytest.fixture
def pd(tmp_path: Path) -> Iterator[_Pd]:
    setup = _Pd(tmp_path)
    try:
        yield setup
    finally:
        setup.close()


def _post(url: str, body: dict[str, Any], deadline_s: float = 30.0) -> httpx.Response:
    """The router registers its workers a moment after it listens: retry its 503s briefly."""
    end = time.monotonic() + deadline_s
    while True:
        r = httpx.post(url, json=body, timeout=30)
        if r.status_code != 503 or time.monotonic() > end:
            return r
        time.sleep(0.2)


def test_sglang_router_pd_mode_runs_in_front_of_emulators(pd: _Pd) -> None:
    r = _post(pd.url + "/generate", {"text": "one two three four " * 30,
                                     "sampling_params": {"max_new_tokens": 6}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 6
    prefill, decode = pd.state(pd.prefill_port), pd.state(pd.decode_port)
    # the router's bootstrap fields, seen by both sides: the prefill's host and bootstrap port,
    # and one random room
    assert prefill["recent_rooms"] == decode["recent_rooms"]
    (seen,) = decode["recent_rooms"]
    assert (seen["host"], seen["port"]) == ("127.0.0.1", pd.bootstrap_port)
    assert prefill["transfers"] == decode["transfers"] == {"ok": 1, "failed": 0}

    # OpenAI chat, streamed: the decode side's tokens come back through the router
    body = {"model": "emulated-model", "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", pd.url + "/v1/chat/completions", json=body, timeout=30) as s:
        assert s.status_code == 200
        events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = [json.loads(e)["usage"] for e in events[:-1] if json.loads(e).get("usage")]
    assert usage[-1]["completion_tokens"] == 5
    assert pd.state(pd.decode_port)["transfers"]["ok"] == 2


def test_a_dead_prefill_ends_in_a_json_error_through_the_router(pd: _Pd) -> None:
    ok = _post(pd.url + "/generate", {"text": "warm up", "sampling_params": {"max_new_tokens": 2}})
    assert ok.status_code == 200, ok.text
    pd.prefill.close()
    t0 = time.monotonic()
    r = httpx.post(pd.url + "/generate", json={"text": "after the crash"}, timeout=30)
    assert r.status_code >= 500
    assert "error" in r.json()
    assert time.monotonic() - t0 < 10
