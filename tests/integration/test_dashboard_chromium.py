"""The live dashboard in real headless Chromium (Debian's ``chromium``, driven by Playwright):
against the example mesh started by ``tokenweir up``, traffic first, the page opened after it:
its first answer draws the history the control plane gathered with nobody watching; it shows
the replicas, the pools' ladder step and admission capacity, the Envoys, and for the free
tenant refused by its token bucket that bucket as the limit that binds, with its recent 429s;
its numbers move when more traffic flows; no console error.

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
from typing import Any

import openai
import pytest
from playwright.sync_api import ConsoleMessage, Page, sync_playwright

from policy import load_policy
from tests.integration.example_mesh import example_policy
from tests.integration.test_e2e_first_contact import call
from tests.integration.up_process import start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # scripts/ensure-system-deps.sh
# headless, nothing fetched in the background, no first-run or sync prompts (Playwright adds
# --headless itself, and a fresh --user-data-dir through launch_persistent_context)
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


def _text(page: Page, selector: str) -> str:
    return page.locator(selector).first.inner_text()


def _until(what: str, check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"the dashboard never showed {what} within {timeout}s")
        time.sleep(0.25)


def test_dashboard_in_chromium_shows_history_binding_limits_and_moves(tmp_path: Path) -> None:
    text, gw = example_policy()
    # a loaded 2-core CI box: the example's 200 ms ext_proc and 50 ms RLS timeouts would fail
    # requests (504) or let them through unchecked (fail open)
    text = text.replace("message_timeout: 200ms", "message_timeout: 2s")
    text = text.replace("timeout: 50ms", "timeout: 1s")
    policy_path = tmp_path / "mesh.yaml"
    policy_path.write_text(text)
    metrics = load_policy(policy_path).control_plane.metrics
    url = f"http://127.0.0.1:{gw}/v1/chat/completions"
    proc, banner = start_up(policy_path, tmp_path / "run", extra_args=("--fresh",))
    problems: list[str] = []
    try:
        assert "tokenweir up: ready" in banner, banner
        assert f"http://{metrics}/dashboard/" in banner  # `up` prints the page's address

        # traffic before anybody opens the page: demo-pro is served (plain and streamed);
        # demo-free runs its 2,000-token bucket dry (256-token reservations): 429s
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
        story = {**hello, "messages": [{"role": "user", "content": "Write a story."}],
                 "max_tokens": 256}  # fmt: skip
        codes = []
        for _ in range(20):
            codes.append(call(url, "tw-demo-free-key", story)[0])
            if codes[-1] == 429:
                break
        assert codes[-1] == 429, codes
        _until("history points", lambda: len(api(metrics)["series"]) >= 8)

        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"),  # a fresh profile
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1400, "height": 1150},
            )  # fmt: skip
            page = context.new_page()

            def on_console(msg: ConsoleMessage) -> None:
                if msg.type in ("error", "warning"):
                    problems.append(f"console {msg.type}: {msg.text}")

            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.goto(f"http://{metrics}/dashboard/")
            page.wait_for_selector("#status[data-updates]", timeout=20_000)

            # the first answer drew the control plane's history, gathered with nobody watching
            status = page.locator("#status")
            points = int(status.get_attribute("data-points") or 0)
            updates = int(status.get_attribute("data-updates") or 0)
            assert points >= 8 and points > updates + 4, (points, updates)  # not one per poll
            assert _chart_has_ink(page, "chart-rps") and _chart_has_ink(page, "chart-tps")

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

            # pools: the ladder's step and admission's capacity, as the filter server has them
            chat = "#pool-status tr[data-pool=chat]"
            _until("chat's ladder step", lambda: _text(page, f"{chat} td.ladder") == "0 of 3")
            # 3 replicas x 256 reported; a loaded box's saturated replicas lower it a while
            _until("chat's admission capacity", lambda: _text(page, f"{chat} td.capacity") == "768")
            assert page.locator("#lanes tr[data-lane='chat/batch'] td.shed-ladder").count() == 1

            # the batch panel: the example's one runner scraped, no job yet (docs/batch.md)
            assert page.locator("#batch-panel").is_visible()
            _until("the batch runner scraped", lambda: _text(page, "#batch td.runners") == "1 of 1")
            assert _text(page, "#batch td.jobs") == "0" and _text(page, "#batch td.lag") == "–"
            assert api(metrics)["batch"]["lines_completed"] == 0

            # demo-free: the bucket binds (it refused), not the day's 1% of 200,000
            free = "#tenants tr[data-tenant=demo-free]"
            _until("demo-free's binding token bucket",
                   lambda: "tokens (bucket" in _text(page, f"{free} td.binding"))  # fmt: skip
            assert float(_text(page, f"{free} td.binding-use").rstrip("%")) >= 50
            want = str(codes.count(429))
            _until(f"demo-free's {want} recent 429s",
                   lambda: _text(page, f"{free} td.recent-429") == want)  # fmt: skip
            o = api(metrics)
            (row,) = [t for t in o["tenants"] if t["tenant"] == "demo-free"]
            assert (row["binding"]["quota"], row["binding"]["window"]) == ("tokens", "bucket")
            assert row["budget"]["window"] == "per_day" and row["budget"]["used"] < 10_000

            # and it moves: more of demo-pro's tokens appear without reloading
            pro_since = "#tenants tr[data-tenant=demo-pro] td.since-start"
            before = _text(page, pro_since)
            for i in range(3):
                assert call(url, "tw-demo-pro-key", {**hello, "user": f"v{i}"})[0] == 200
            _until("demo-pro's tokens since start move", lambda: _text(page, pro_since) != before)

            page.wait_for_timeout(1500)  # one more poll draws the charts with the new points
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            if os.environ.get("TOKENWEIR_DASHBOARD_SCREENSHOT"):
                shutil.copy(shot, os.environ["TOKENWEIR_DASHBOARD_SCREENSHOT"])
            context.close()
    finally:
        stop_up(proc)
    assert problems == []


def api(metrics: object) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{metrics}/api/v1/overview?points=3600", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _chart_has_ink(page: Page, canvas: str) -> bool:
    """Some pixel of the chart's plot is coloured (a line, not only the grey grid)."""
    return bool(page.evaluate(
        """(id) => {
            const c = document.getElementById(id);
            const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            for (let i = 0; i < d.length; i += 4) {
              const [r, g, b, a] = [d[i], d[i + 1], d[i + 2], d[i + 3]];
              if (a > 0 && (Math.abs(r - g) > 40 || Math.abs(g - b) > 40)) return true;
            }
            return false;
        }""",
        canvas,
    ))  # fmt: skip
