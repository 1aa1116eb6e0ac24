"""Observability of a real mesh (`tokenweir up` on the example policy, with Prometheus), a little
traffic, then:

* docs/metrics.md is the truth about every component's metrics, and Prometheus scrapes them all:

* every metric family a component exports is in the catalog, and every catalogued one is
  exported (control plane, rate-limit service, filter server, emulator; Envoy: the statistics
  the catalog names, except those Envoy creates on first use);
* label values stay inside the policy's names (a made-up model counts as ``other``);
* Prometheus has every component as a target, all up;
* the gateway's JSON access log carries tenant, lane, model, replica, tokens, TTFT, cost and the
  rate-limit decision from dynamic metadata, never from what the client's headers claim;
* a money budget is settled through real Envoy with the real price of the reported usage.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.example_mesh import example_policy
from tests.integration.test_e2e_first_contact import call
from tests.integration.test_up_state import cli
from tests.integration.up_process import ROOT, mesh_redis_url, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HELLO = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
JOBS = {"controlplane", "ratelimit", "filters", "emulator", "envoy", "batch-runner"}


def catalog() -> dict[str, dict[str, bool]]:
    """component → {metric name: required} from docs/metrics.md (``*on use*`` rows: not required)."""
    out: dict[str, dict[str, bool]] = {}
    current = None
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        m = re.match(r"<!-- component: (\w+) -->", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        m = re.match(r"\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \|", line)
        if m and current is not None:
            current[m.group(1)] = "*on use*" not in line
    return out


def families(text: str) -> set[str]:
    names = set(re.findall(r"^# TYPE (\S+) \S+$", text, re.M))
    return {n for n in names if not n.endswith("_created")}


def status(url: str, key: str, body: dict[str, object], extra: dict[str, str] | None = None) -> int:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={**headers, **(extra or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed (scripts/ensure-system-deps.sh)")
    tmp = tmp_path_factory.mktemp("catalog")
    text, gw = example_policy()
    (tmp / "mesh.yaml").write_text(text)
    proc, banner = start_up(
        tmp / "mesh.yaml",
        tmp / "run",
        extra_args=("--fresh", "--scrape-interval", "1"),
        prometheus=True,
    )
    try:
        assert "tokenweir up: ready" in banner, banner
        url = f"http://127.0.0.1:{gw}/v1/chat/completions"
        assert call(url, "tw-demo-pro-key", HELLO)[0] == 200
        assert status(url, "tw-demo-pro-key", {**HELLO, "stream": True}) == 200
        status(url, "tw-demo-pro-key", {**HELLO, "model": "made-up-model"})
        assert call(url, "no-such-key", HELLO)[0] == 401
        # demo-free: one request a minute, so of three at least one is denied (429, Retry-After)
        done = cli(
            "quota", "-c", str(tmp / "mesh.yaml"), "set", "demo-free", "requests.per_minute=1"
        )
        assert done.returncode == 0, done.stderr
        time.sleep(1.0)  # live quota fields are cached for up to 0.5 s
        free = [status(url, "tw-demo-free-key", HELLO) for _ in range(3)]
        assert free.count(200) >= 1 and free.count(429) >= 1, free
        # last: demo-pro's key, with every header a client could use to claim demo-free
        spoof = {"x-tenant": "demo-free", "x-tokenweir-tenant": "demo-free",
                 "x-tokenweir-lane": "batch", "x-tokenweir-tier": "free"}  # fmt: skip
        assert status(url, "tw-demo-pro-key", HELLO, spoof) == 200
        prom = re.search(r"prometheus +(http://\S+)", banner)
        assert prom is not None, banner
        yield {
            "prometheus": prom.group(1),
            "banner": banner,
            "run": tmp / "run",
            "redis": mesh_redis_url(tmp / "mesh.yaml"),
            "emulators": [
                int(p) for p in re.findall(r"emulator +chat#\d+ http://127.0.0.1:(\d+)", banner)
            ],
            "free": free,
        }
    finally:
        stop_up(proc)


def active_targets(prometheus: str, timeout: float = 30.0) -> list[dict[str, object]]:
    """Prometheus's targets once every one has been scraped up (its discovery starts after ~5 s)."""
    deadline = time.monotonic() + timeout
    targets: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        targets = json.loads(get(prometheus + "/api/v1/targets"))["data"]["activeTargets"]
        if targets and all(t["health"] == "up" for t in targets):
            return targets
        time.sleep(0.5)
    return targets


def test_prometheus_scrapes_every_component_up(mesh: dict[str, object]) -> None:
    targets = active_targets(str(mesh["prometheus"]))
    down = [
        (t["scrapeUrl"], t["health"], t.get("lastError")) for t in targets if t["health"] != "up"
    ]
    assert down == []
    by_job: dict[str, int] = {}
    for t in targets:
        job = t["labels"]["job"]  # type: ignore[index]
        by_job[job] = by_job.get(job, 0) + 1
    # the example policy: 3 + 1 (the fallback pool) emulator replicas, a gateway and a sidecar,
    # one of each service, one batch runner
    assert by_job == {
        "controlplane": 1, "ratelimit": 1, "filters": 1, "emulator": 4, "envoy": 2,
        "batch-runner": 1,
    }  # fmt: skip
    # the repository's rules are loaded
    rules = json.loads(get(str(mesh["prometheus"]) + "/api/v1/rules"))["data"]["groups"]
    assert {"tokenweir.alerts", "tokenweir.recording", "tokenweir.slo.ttft"} <= {
        g["name"] for g in rules
    }


def test_every_exported_metric_is_catalogued_and_every_catalogued_one_exported(
    mesh: dict[str, object],
) -> None:
    docs = catalog()
    targets = active_targets(str(mesh["prometheus"]))
    seen: dict[str, set[str]] = {}
    for t in targets:
        job = str(t["labels"]["job"])  # type: ignore[index]
        seen.setdefault(job, set()).update(families(get(str(t["scrapeUrl"]))))
    assert set(seen) == JOBS
    for job in ("controlplane", "ratelimit", "filters", "emulator"):
        documented = set(docs[job])
        required = {n for n, req in docs[job].items() if req}  # *on use* rows may be absent
        assert seen[job] - documented == set(), f"{job}: exported but not in docs/metrics.md"
        assert required - seen[job] == set(), f"{job}: in docs/metrics.md but not exported"
    envoy = {n for n, req in docs["envoy"].items() if req}
    assert envoy - seen["envoy"] == set(), "envoy: catalogued statistics Envoy does not export"


def test_label_values_stay_inside_the_policy(mesh: dict[str, object]) -> None:
    targets = active_targets(str(mesh["prometheus"]))
    text = "".join(
        get(str(t["scrapeUrl"])) for t in targets if t["labels"]["job"] in ("filters", "ratelimit")
    )  # type: ignore[index]
    tenants = set(re.findall(r'tenant="([^"]*)"', text))
    models = set(re.findall(r'model="([^"]*)"', text))
    assert tenants and tenants <= {"demo-free", "demo-pro", "other"}
    assert models and models <= {"llama-3.1-8b", "other"}


def access_log(run: Path) -> list[dict[str, object]]:
    """The edge Envoy's JSON access log lines (they share its log file: policy default stdout)."""
    lines = []
    for line in (run / "envoy-edge-0.log").read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def wait_log(run: Path, count: int, timeout: float = 15.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    lines = access_log(run)
    while len(lines) < count and time.monotonic() < deadline:
        time.sleep(0.3)  # Envoy flushes its access log every second (--file-flush-interval-msec)
        lines = access_log(run)
    return lines


def test_access_log_fields_come_from_metadata_not_client_headers(mesh: dict[str, object]) -> None:
    run = Path(str(mesh["run"]))
    lines = [x for x in wait_log(run, 8) if x["path"] == "/v1/chat/completions"]
    ok = [x for x in lines if x["status"] == 200 and x["tenant"] != "demo-free"]
    assert len(ok) >= 3, lines
    replicas = {f"127.0.0.1:{p}" for p in mesh["emulators"]}  # type: ignore[attr-defined]
    for x in ok:
        assert x["tenant"] == "demo-pro" and x["tier"] == "pro" and x["lane"] == "interactive"
        assert x["request_id"] and x["model"] in ("llama-3.1-8b", "made-up-model")
        assert x["upstream_replica"] in replicas
        assert isinstance(x["prompt_tokens"], (int, float)) and x["prompt_tokens"] > 0
        assert isinstance(x["completion_tokens"], (int, float)) and x["completion_tokens"] > 0
        assert isinstance(x["cached_tokens"], (int, float))
        assert isinstance(x["ttft_ms"], (int, float)) and x["ttft_ms"] > 0
        assert isinstance(x["cost_usd"], (int, float)) and x["cost_usd"] > 0
    # the rate-limit service's decision (the very first call may time out while it warms up:
    # fail-open, no decision)
    assert all(x["ratelimit"] == "ok" for x in ok[1:]), ok
    assert all(x["ratelimit_reason"] == "tokens.bucket" for x in ok[1:])
    # the last OK request claimed to be demo-free in every header a client could try
    spoofed = ok[-1]
    assert spoofed["tenant"] == "demo-pro" and spoofed["lane"] == "interactive"
    unauth = [x for x in lines if x["status"] == 401]
    assert unauth and unauth[0]["tenant"] is None and unauth[0]["ratelimit"] is None
    denied = [x for x in lines if x["status"] == 429]
    assert denied, lines
    assert denied[0]["tenant"] == "demo-free" and denied[0]["ratelimit"] == "over_limit"
    assert denied[0]["ratelimit_reason"] == "requests.minute"
    assert isinstance(denied[0]["retry_after_s"], (int, float)) and denied[0]["retry_after_s"] > 0


def test_money_budget_is_settled_with_the_real_price_through_envoy(mesh: dict[str, object]) -> None:
    """demo-free's $1/day budget: the one admitted request's reservation (every token at the
    completion price) was replaced at stream end by the price of its reported usage, which the
    settle descriptor carried as entry ``usd`` from the filter server's dynamic metadata."""
    import redis

    line = [
        x
        for x in wait_log(Path(str(mesh["run"])), 8)
        if x["tenant"] == "demo-free" and x["status"] == 200
    ]
    assert len(line) == 1, line
    x = line[0]
    prompt, completion, cached = (
        int(x[k]) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")
    )  # type: ignore[call-overload]
    micros = math.ceil(((prompt - cached) * 0.2 + cached * 0.1 + completion * 0.6) - 1e-6)
    client = redis.Redis.from_url(str(mesh["redis"]))
    deadline = time.monotonic() + 10
    used: list[int] = []
    while time.monotonic() < deadline:
        keys = client.keys("tw:{demo-free}:w:usd:day:*")
        used = [int(client.get(k) or 0) for k in keys]
        if used == [micros]:
            break
        time.sleep(0.2)
    assert used == [micros]
    assert x["cost_usd"] == pytest.approx(micros / 1e6, abs=1e-6)
