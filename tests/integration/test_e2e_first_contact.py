"""The README's first-contact calls against `tokenweir up` on examples/mesh.yaml (ports moved to
free ones, emulators sped up): the demo keys work, an unknown key gets 401, a spoofed tenant header
is ignored, the free tenant hits its quota with a 429 and Retry-After, the openai client streams."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.integration.example_mesh import example_policy
from tests.integration.up_process import ROOT, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# examples/burst.py, the README's burst (examples/ is not a package)
_spec = importlib.util.spec_from_file_location("example_burst", ROOT / "examples" / "burst.py")
assert _spec is not None and _spec.loader is not None
_burst = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _burst  # its dataclass looks its module up
_spec.loader.exec_module(_burst)
burst, report = _burst.burst, _burst.report
ADMISSION_CODES = {"queue_full", "tenant_queue_full", "wait_too_long", "fell_behind", "timed_out"}
LADDER_CODES = {"degraded"}  # the ladder's shed step (batch, past 1.5)


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


def filters_metrics(banner: str) -> str:
    m = re.search(r"filters +grpc://\S+ +metrics (http://\S+/metrics)", banner)
    assert m is not None, banner
    with urllib.request.urlopen(m.group(1), timeout=10) as r:
        return str(r.read().decode())


def admission_limit(banner: str) -> float:
    m = re.search(
        r'^tokenweir_admission_limit\{pool="chat"\} (\S+)$', filters_metrics(banner), re.M
    )
    assert m is not None
    return float(m.group(1))


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
        # the pool declares no capacity: admission follows what its replicas report
        # (/get_server_info: the emulator's 256 running slots, three replicas), once the control
        # plane has read it and published it in the pool state
        deadline = time.monotonic() + 20
        while admission_limit(banner) != 768 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert admission_limit(banner) == 768

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


def test_readme_overload(tmp_path: Path) -> None:
    """README "Overload": the example with its pool's capacity set to 4 per replica, the burst
    of examples/burst.py at the emulators' real speed. Interactive starts first; every request
    that is not served is answered with 503, a Retry-After and an OpenAI-style error code."""
    text, gw = example_policy(time_scale=1.0)
    commented = "    # capacity: {max_running_requests: 64}"
    assert commented in text
    text = text.replace(commented, "    capacity: {max_running_requests: 4}  #")
    (tmp_path / "mesh.yaml").write_text(text)
    proc, banner = start_up(tmp_path / "mesh.yaml", tmp_path / "run", extra_args=("--fresh",))
    try:
        assert "tokenweir up: ready" in banner, banner
        url = f"http://127.0.0.1:{gw}/v1/chat/completions"
        outcomes = asyncio.run(burst(url, pro=40, free=8))
        pro = [o for o in outcomes if o.tenant == "pro"]
        # 12 slots (4 x 3 replicas), interactive first: at least those start
        assert sum(o.status == 200 for o in pro) >= 12, report(outcomes)
        turned = [o for o in outcomes if o.status != 200]
        assert turned, report(outcomes)  # 48 streams of ~1 s cannot all start within 1 s
        for o in turned:
            assert o.retry_after is not None and float(o.retry_after) >= 1, o
            if o.status == 429:  # the free tier's 2,000-token bucket cannot hold 8 whole
                # answers of 256 (a whole-answer 429, docs/quotas.md): refused before admission
                assert o.tenant == "free" and o.code == "rate_limit_exceeded", o
                continue
            assert o.status == 503 and o.code in ADMISSION_CODES | LADDER_CODES, o
        assert admission_limit(banner) == 12
        assert ladder_degrades_the_free_tier_to_the_fallback_pool(url, banner)
    finally:
        stop_up(proc)


def ladder_degrades_the_free_tier_to_the_fallback_pool(url: str, banner: str) -> bool:
    """With the pool's 12 slots held by long pro streams (saturation 1), the ladder takes its
    fallback step: a free request is clamped and answered by chat-small's model."""

    async def run() -> bool:
        async with aiohttp.ClientSession() as s:
            hold = [asyncio.create_task(_burst.one(s, url, "pro", i, 3000)) for i in range(12)]
            try:
                # the 12 slots busy read 1.0 (the fallback step); a step 3 the burst left
                # (batch shed) is left once its dwell is over
                deadline = time.monotonic() + 20
                while ladder_step(banner) != 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                assert ladder_step(banner) == 2, governance_metrics(banner)
                free = await _burst.one(s, url, "free", 0, 50)
                assert free.status == 200, free
                assert free.degraded == "clamp_max_tokens,fallback", free
                assert free.model == "llama-3.2-1b", free
                return True
            finally:
                for t in hold:
                    t.cancel()
                await asyncio.gather(*hold, return_exceptions=True)

    return asyncio.run(run())


def governance_metrics(banner: str) -> str:
    """The filter server's admission, ladder and rejection lines (a failure's evidence)."""
    keep = ("tokenweir_admission_", "tokenweir_filters_ladder_", "tokenweir_filters_rejections_")
    lines = filters_metrics(banner).splitlines()
    return "\n".join(x for x in lines if x.startswith(keep) and "_created" not in x)


def ladder_step(banner: str) -> float:
    m = re.search(
        r'^tokenweir_filters_ladder_step\{pool="chat"\} (\S+)$', filters_metrics(banner), re.M
    )
    return float(m.group(1)) if m else 0.0
