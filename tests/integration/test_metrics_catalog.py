"""docs/metrics.md is the truth about every component's metrics, and `tokenweir up`'s Prometheus
scrapes them all: one real mesh (`tokenweir up` on the example policy), a little traffic, then

* every metric family a component exports is in the catalog, and every catalogued one is
  exported (control plane, rate-limit service, filter server, emulator; Envoy: the statistics
  the catalog names, except those Envoy creates on first use);
* label values stay inside the policy's names (a made-up model counts as ``other``);
* Prometheus has every component as a target, all up.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.integration.test_e2e_first_contact import call, example_policy
from tests.integration.up_process import ROOT, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HELLO = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
JOBS = {"controlplane", "ratelimit", "filters", "emulator", "envoy"}


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


def status(url: str, key: str, body: dict[str, object]) -> int:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )  # fmt: skip
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
        prom = re.search(r"prometheus +(http://\S+)", banner)
        assert prom is not None, banner
        yield {"prometheus": prom.group(1), "banner": banner}
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
    # the example policy: 3 emulator replicas, a gateway and a sidecar, one of each service
    assert by_job == {"controlplane": 1, "ratelimit": 1, "filters": 1, "emulator": 3, "envoy": 2}
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
        assert seen[job] - documented == set(), f"{job}: exported but not in docs/metrics.md"
        assert documented - seen[job] == set(), f"{job}: in docs/metrics.md but not exported"
    required = {n for n, req in docs["envoy"].items() if req}
    assert required - seen["envoy"] == set(), "envoy: catalogued statistics Envoy does not export"


def test_label_values_stay_inside_the_policy(mesh: dict[str, object]) -> None:
    targets = active_targets(str(mesh["prometheus"]))
    text = "".join(
        get(str(t["scrapeUrl"])) for t in targets if t["labels"]["job"] in ("filters", "ratelimit")
    )  # type: ignore[index]
    tenants = set(re.findall(r'tenant="([^"]*)"', text))
    models = set(re.findall(r'model="([^"]*)"', text))
    assert tenants and tenants <= {"demo-free", "demo-pro", "other"}
    assert models and models <= {"llama-3.1-8b", "other"}
