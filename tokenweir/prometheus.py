"""A real Prometheus for `tokenweir up` (Debian's ``prometheus`` package), when it is installed.

``scrape_targets`` lists every /metrics endpoint of a mesh (pure: policy + the Envoys' admin
addresses); ``render_config`` turns them into ``prometheus.yml`` with the repository's recording
rules and alerts (``deploy/prometheus/rules/``, checked by ``promtool`` in the tests). The
``Prometheus`` child keeps its data in the run folder and listens on 127.0.0.1 only.
docs/metrics.md lists what each target exports; docs/operations.md says how to use it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from policy import Policy
from policy.servers import replica_addresses, worker_metrics_ports
from runtime.children import Child, wait_child_port
from wire.jsontypes import JsonObject

__all__ = [
    "RULES_DIR",
    "Prometheus",
    "Target",
    "prometheus_binary",
    "render_config",
    "scrape_targets",
]

RULES_DIR = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "rules"


@dataclass(frozen=True)
class Target:
    """One scrape target: ``job`` groups targets of one component kind."""

    job: str
    address: str  # host:port
    labels: tuple[tuple[str, str], ...] = ()
    path: str = "/metrics"


def scrape_targets(policy: Policy, envoy_admins: Mapping[str, str]) -> list[Target]:
    """Every component of the mesh `up` starts: each control plane, each rate-limit service and
    filter server replica and each of its worker processes (one /metrics port each: replica ``r``,
    worker ``w`` on ``metrics_port + r * processes + w``, as ``up`` gives them), every emulator
    replica, and each Envoy's admin ``/stats/prometheus`` (``envoy_admins``: node name, or
    ``node#i`` for a gateway's replicas, → ``host:port``) and each batch runner. ``policy.replicas`` says how many
    servers of each kind run (``up`` puts ``--replicas`` there)."""
    n = policy.replicas
    cp = policy.control_plane
    out = [
        Target("controlplane", str(a), (("replica", str(i)),) if n.controlplane > 1 else ())
        for i, a in enumerate(replica_addresses(cp.metrics, n.controlplane))
    ]
    rl, fs = policy.ratelimit, policy.filters
    if rl is not None and rl.metrics_port is not None:
        out += _worker_targets("ratelimit", rl.metrics_port, n.ratelimit, rl.replicas)
    if fs is not None and fs.metrics_port is not None:
        out += _worker_targets("filters", fs.metrics_port, n.filters, fs.processes)
    for name, pool in policy.pools.items():
        em = pool.emulated
        if em is None or em.base_port is None:
            continue
        for i in range(em.replicas):
            labels = (("pool", name), ("replica", str(i)))
            out.append(Target("emulator", f"127.0.0.1:{em.base_port + i}", labels))
    if policy.batch is not None:  # the batch runners (docs/batch.md "Metrics")
        r = policy.batch.runner
        for i in range(r.replicas):
            out.append(
                Target("batch-runner", f"127.0.0.1:{r.metrics_port + i}", (("replica", str(i)),))
            )
    for node, admin in envoy_admins.items():
        out.append(Target("envoy", admin, (("node", node),), "/stats/prometheus"))
    return out


def _worker_targets(job: str, first: int, replicas: int, workers: int) -> list[Target]:
    out = []
    for r, w, port in worker_metrics_ports(first, replicas, workers):
        labels = (
            (("worker", str(w)),) if replicas == 1 else (("replica", str(r)), ("worker", str(w)))
        )
        out.append(Target(job, f"127.0.0.1:{port}", labels))
    return out


def render_config(
    targets: Iterable[Target],
    *,
    interval_s: float = 5.0,
    rules_dir: Path = RULES_DIR,
    token_file: Path | None = None,
) -> str:
    """``prometheus.yml`` (JSON is valid YAML: no YAML writer needed). ``token_file``: the admin
    token every scrape sends (``runtime.admin_auth``; Envoy's loopback admin ignores it)."""
    jobs: dict[tuple[str, str], list[Target]] = {}
    for t in targets:
        jobs.setdefault((t.job, t.path), []).append(t)
    scrape_configs: list[JsonObject] = []
    for (job, path), ts in jobs.items():
        scrape_configs.append(
            {
                "job_name": job,
                "metrics_path": path,
                "static_configs": [{"targets": [t.address], "labels": dict(t.labels)} for t in ts],
            }
        )
        if token_file is not None:
            scrape_configs[-1]["authorization"] = {
                "type": "Bearer",
                "credentials_file": str(token_file),
            }
    interval = f"{max(1, round(interval_s * 1000))}ms"
    config = {
        "global": {
            "scrape_interval": interval,
            "evaluation_interval": interval,
            "scrape_timeout": interval if interval_s < 10 else "10s",
        },
        "rule_files": [str(rules_dir / "*.yml")],
        "scrape_configs": scrape_configs,
    }
    return json.dumps(config, indent=2) + "\n"


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    """The Prometheus process of one `up` run; ``aclose()`` stops it."""

    def __init__(self, binary: str, run_dir: Path, host: str, port: int, config: str) -> None:
        self.dir = run_dir / "prometheus"
        self.host, self.port = host, port
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(config)
        argv = [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address={host}:{port}",
            "--storage.tsdb.retention.time=2d",
            "--log.level=warn",
        ]
        self.child = Child("prometheus", argv, run_dir / "prometheus.log")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self.child.start()
        await wait_child_port(self.host, self.port, self.child)

    async def aclose(self) -> None:
        await self.child.aclose()
