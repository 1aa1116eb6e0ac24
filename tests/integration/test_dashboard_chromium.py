"""The live dashboard in real headless Chromium (Debian's ``chromium``, driven by Playwright):
against the example mesh started by ``tokenweir up``, the page loads without a console error,
shows the mesh's replicas, tenants and Envoys, and its numbers move when traffic flows.

``TOKENWEIR_DASHBOARD_SCREENSHOT=docs/img/dashboard.png`` also saves the screenshot the docs
show (the test always saves one in its temporary folder).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from playwright.sync_api import ConsoleMessage, Page, sync_playwright

from controlplane.policy import load_policy
from tests.integration.test_e2e_first_contact import call, example_policy
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # scripts/ensure-system-deps.sh


def _text(page: Page, selector: str) -> str:
    return page.locator(selector).first.inner_text()


def _until(what: str, check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"the dashboard never showed {what} within {timeout}s")
        time.sleep(0.25)


def test_dashboard_in_chromium_shows_the_mesh_and_moves_with_traffic(tmp_path: Path) -> None:
    text, gw = example_policy()
    # a loaded 2-core CI box: the example's 200 ms ext_proc and 50 ms RLS timeouts would fail
    # requests (504) or let them through unchecked (fail open)
    text = text.replace("message_timeout: 200ms", "message_timeout: 2s")
    text = text.replace("timeout: 50ms", "timeout: 1s")
    policy_path = tmp_path / "mesh.yaml"
    policy_path.write_text(text)
    metrics = load_policy(policy_path).control_plane.metrics
    url = f"http://127.0.0.1:{gw}/v1/chat/completions"
    proc, banner = start_up(policy_path, tmp_path / "run")
    problems: list[str] = []
    try:
        assert "tokenweir up: ready" in banner, banner
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})

            def on_console(msg: ConsoleMessage) -> None:
                if msg.type in ("error", "warning"):
                    problems.append(f"console {msg.type}: {msg.text}")

            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.goto(f"http://{metrics}/dashboard/")
            page.wait_for_selector("#status[data-updates]", timeout=20_000)

            # the running mesh: 3 emulated replicas, both tenants of the policy, the Envoys
            rows = page.locator("#replicas tbody tr[data-pool=chat]")
            _until("3 replicas of pool chat", lambda: rows.count() == 3)
            _until(
                "healthy replicas",
                lambda: page.locator("#replicas tbody tr[data-pool=chat] td.ok").count() == 3,
            )
            for tenant in ("demo-free", "demo-pro"):
                assert page.locator(f"#tenants tr[data-tenant={tenant}]").count() == 1
            _until("the edge Envoy's ACKed routes", lambda: "edge-0" in _text(page, "#envoys"))
            assert _text(page, "#tenants tr[data-tenant=demo-pro] td.tokens") == "0"
            assert _text(page, "#tenants tr[data-tenant=demo-free] td.rejections") == "0"

            # traffic: demo-pro is served; demo-free runs past its 10-request burst (429s)
            hello = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}],
                     "max_tokens": 16}  # fmt: skip
            for i in range(6):
                status, _, _ = call(url, "tw-demo-pro-key", {**hello, "user": f"u{i}"})
                assert status == 200
            with openai.OpenAI(base_url=url.removesuffix("/chat/completions"),
                               api_key="tw-demo-pro-key", max_retries=0) as client:  # fmt: skip
                for i in range(3):  # streamed: the gateway measures time between tokens
                    stream = client.chat.completions.create(
                        model="llama-3.1-8b", messages=[{"role": "user", "content": f"story {i}"}],
                        max_tokens=24, stream=True,
                    )  # fmt: skip
                    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            codes = [call(url, "tw-demo-free-key", hello)[0] for _ in range(16)]
            assert 429 in codes, codes

            pro_tokens = "#tenants tr[data-tenant=demo-pro] td.tokens"
            _until("demo-pro's tokens move", lambda: _text(page, pro_tokens) not in ("0", "–"))
            pro_since = "#tenants tr[data-tenant=demo-pro] td.since-start"
            _until("demo-pro's tokens since start", lambda: _text(page, pro_since) != "0")

            def window_used() -> str:  # the API's number, as the page formats it
                with urllib.request.urlopen(f"http://{metrics}/api/v1/overview") as r:
                    rows = json.loads(r.read())["tenants"]
                (pro,) = [t for t in rows if t["tenant"] == "demo-pro"]
                assert pro["budget"]["window"] == "per_month"  # the longest window of its quota
                return f"{pro['budget']['used']:,}"

            # the page shows the budget's window as the quota counts it (Redis), not since start
            _until("demo-pro's month as the API has it",
                   lambda: _text(page, pro_tokens) == window_used())  # fmt: skip
            assert "per_month" in _text(page, "#tenants tr[data-tenant=demo-pro] td.budget")
            free_rej = "#tenants tr[data-tenant=demo-free] td.rejections"
            want = str(codes.count(429))  # every 429 is a requests-quota denial with Retry-After
            _until(f"demo-free's {want} rejections", lambda: _text(page, free_rej) == want)

            def tokens_per_s() -> float:
                with urllib.request.urlopen(f"http://{metrics}/api/v1/overview?points=60") as r:
                    series = json.loads(r.read())["series"]
                return max((p["completion_tokens_per_s"] or 0.0) for p in series)

            _until("a tokens-per-second point above zero", lambda: tokens_per_s() > 0)
            page.wait_for_timeout(1500)  # one more poll draws the charts with the new points
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            if os.environ.get("TOKENWEIR_DASHBOARD_SCREENSHOT"):
                shutil.copy(shot, os.environ["TOKENWEIR_DASHBOARD_SCREENSHOT"])
            browser.close()
    finally:
        stop_up(proc)
    assert problems == []
