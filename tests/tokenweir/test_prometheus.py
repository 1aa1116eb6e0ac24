"""The scrape configuration `tokenweir up` gives Prometheus: every component of the policy, and a
file `promtool check config` accepts (with the repository's rules)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from policy import load_policy
from policy.servers import Replicas
from tokenweir.prometheus import RULES_DIR, render_config, scrape_targets

ROOT = Path(__file__).resolve().parents[2]
POLICY = load_policy(ROOT / "examples" / "mesh.yaml")


def test_every_component_of_the_policy_is_a_target() -> None:
    targets = scrape_targets(
        POLICY, {"edge": "127.0.0.1:9901", "inventory-sidecar": "127.0.0.1:9902"}
    )
    got = sorted((t.job, t.address, t.path, dict(t.labels).get("pool")) for t in targets)
    assert got == [
        ("batch-runner", "127.0.0.1:18075", "/metrics", None),
        ("controlplane", "127.0.0.1:18001", "/metrics", None),
        ("emulator", "127.0.0.1:30001", "/metrics", "chat"),
        ("emulator", "127.0.0.1:30002", "/metrics", "chat"),
        ("emulator", "127.0.0.1:30003", "/metrics", "chat"),
        ("emulator", "127.0.0.1:30011", "/metrics", "chat-small"),
        ("envoy", "127.0.0.1:9901", "/stats/prometheus", None),
        ("envoy", "127.0.0.1:9902", "/stats/prometheus", None),
        ("filters", "127.0.0.1:18096", "/metrics", None),
        ("ratelimit", "127.0.0.1:18091", "/metrics", None),
    ]


def test_every_replica_and_worker_of_every_server_is_a_target() -> None:
    """``up --replicas`` (or ``replicas:``): each control plane, each rate-limit service and
    filter server replica with each of its worker processes, each gateway Envoy."""
    policy = dataclasses.replace(
        POLICY,
        replicas=Replicas(gateway=2, filters=2, ratelimit=3, controlplane=2),
        filters=dataclasses.replace(POLICY.filters, processes=2),
    )
    admins = {"edge#0": "127.0.0.1:9901", "edge#1": "127.0.0.1:9902"}
    got = sorted((t.job, t.address, dict(t.labels).get("replica"), dict(t.labels).get("worker"))
                 for t in scrape_targets(policy, admins) if t.job != "emulator")  # fmt: skip
    assert got == [
        ("batch-runner", "127.0.0.1:18075", "0", None),
        ("controlplane", "127.0.0.1:18001", "0", None),
        ("controlplane", "127.0.0.1:18002", "1", None),
        ("envoy", "127.0.0.1:9901", None, None),
        ("envoy", "127.0.0.1:9902", None, None),
        # replica r's worker w on metrics_port + r * processes + w
        ("filters", "127.0.0.1:18096", "0", "0"),
        ("filters", "127.0.0.1:18097", "0", "1"),
        ("filters", "127.0.0.1:18098", "1", "0"),
        ("filters", "127.0.0.1:18099", "1", "1"),
        ("ratelimit", "127.0.0.1:18091", "0", "0"),
        ("ratelimit", "127.0.0.1:18092", "1", "0"),
        ("ratelimit", "127.0.0.1:18093", "2", "0"),
    ]
    assert len({t.address for t in scrape_targets(policy, admins)}) == 16  # no port twice


def test_config_groups_jobs_and_loads_the_rules(tmp_path: Path) -> None:
    text = render_config(scrape_targets(POLICY, {"edge": "127.0.0.1:9901"}), interval_s=2)
    cfg = json.loads(text)
    assert cfg["global"]["scrape_interval"] == "2000ms"
    assert cfg["rule_files"] == [str(RULES_DIR / "*.yml")]
    jobs = {c["job_name"]: c for c in cfg["scrape_configs"]}
    assert set(jobs) == {
        "controlplane",
        "ratelimit",
        "filters",
        "emulator",
        "envoy",
        "batch-runner",
    }
    assert jobs["envoy"]["static_configs"][0]["labels"] == {"node": "edge"}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    done = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
