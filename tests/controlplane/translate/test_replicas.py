"""Server replicas and DNS-named endpoints in the rendered config (docs/deploy.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToDict

from controlplane.reloader import snapshots_for
from controlplane.translate.render import render
from controlplane.translate.static import static_bootstrap
from controlplane.xds.cache import SnapshotCache
from controlplane.xds.types import CLUSTER, ENDPOINT, LISTENER
from policy import load_policy_text
from policy.servers import Replicas
from tokenweir.envoy_launcher import validate

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "mesh.yaml"
SCALED = "version: 1\nreplicas: {gateway: 3, filters: 2, ratelimit: 2}\n" + "".join(
    line + "\n" for line in EXAMPLE.read_text().splitlines() if not line.startswith("version:")
)  # the example leaves room for replicas (policy.ports checks it)
K8S = """
version: 1
ratelimit: {address: "tokenweir-ratelimit.tokenweir.svc.cluster.local:18081"}
filters: {address: 127.0.0.1:18082}
pools:
  chat:
    models: [m]
    endpoints: [sglang-chat-0.sglang-chat:30000, sglang-chat-1.sglang-chat:30000]
gateways:
  edge:
    listen: 0.0.0.0:10000
    routes:
      - {name: chat, match: {prefix: /}, pool: chat, rate_limit: {enabled: true},
         filters: {plugins: [identity, tokens]}}
"""


def _hosts(cluster: dict) -> list[str]:
    eps = cluster["loadAssignment"]["endpoints"][0]["lbEndpoints"]
    return [
        f"{e['endpoint']['address']['socketAddress']['address']}:"
        f"{e['endpoint']['address']['socketAddress']['portValue']}"
        for e in eps
    ]


def test_server_replicas_are_endpoints_on_consecutive_ports_with_health_checks() -> None:
    res = render(load_policy_text(SCALED))["edge"]
    rl = MessageToDict(res[CLUSTER]["tokenweir_ratelimit"])
    fs = MessageToDict(res[CLUSTER]["tokenweir_filters"])
    assert _hosts(rl) == ["127.0.0.1:18081", "127.0.0.1:18082"]
    assert _hosts(fs) == ["127.0.0.1:18085", "127.0.0.1:18086"]
    for c in (rl, fs):
        (hc,) = c["healthChecks"]
        assert "grpcHealthCheck" in hc and hc["interval"] == "1s"
        assert c["outlierDetection"]["consecutiveLocalOriginFailure"] == 2
    listener = MessageToDict(res[LISTENER]["edge_gateway"])
    assert listener["enableReusePort"] is True  # the gateway replicas share the port


def test_a_single_replica_keeps_the_plain_cluster() -> None:
    res = render(load_policy_text(EXAMPLE.read_text()))["edge"]
    rl = MessageToDict(res[CLUSTER]["tokenweir_ratelimit"])
    assert _hosts(rl) == ["127.0.0.1:18081"]
    assert "healthChecks" not in rl and "outlierDetection" not in rl
    assert "enableReusePort" not in MessageToDict(res[LISTENER]["edge_gateway"])


def test_dns_named_endpoints_become_strict_dns_hashed_by_hostname() -> None:
    res = render(load_policy_text(K8S))["edge"]
    pool = MessageToDict(res[CLUSTER]["pool_chat"])
    assert pool["type"] == "STRICT_DNS" and "edsClusterConfig" not in pool
    assert pool["commonLbConfig"]["consistentHashingLbConfig"]["useHostnameForHashing"] is True
    assert _hosts(pool) == ["sglang-chat-0.sglang-chat:30000", "sglang-chat-1.sglang-chat:30000"]
    assert "pool_chat" not in res[ENDPOINT]  # nothing for EDS to carry
    rl = MessageToDict(res[CLUSTER]["tokenweir_ratelimit"])
    assert rl["type"] == "STRICT_DNS" and rl["healthChecks"]  # every resolved pod is checked
    fs = MessageToDict(res[CLUSTER]["tokenweir_filters"])
    assert "type" not in fs or fs["type"] == "STATIC"  # the sidecar on loopback
    for group, snap in snapshots_for(render(load_policy_text(K8S))).items():
        SnapshotCache().check(group, snap)


@pytest.mark.parametrize("text", [SCALED, K8S], ids=["replicas", "dns"])
def test_envoy_accepts_replicas_and_dns_clusters(text: str) -> None:
    res = render(load_policy_text(text))["edge"]
    ok, message = validate(static_bootstrap(res, node_id="edge"))
    assert ok, message


def test_replicas_flag_parses_and_names_what_is_wrong() -> None:
    base = Replicas(gateway=2)
    assert Replicas.parse("filters=3, ratelimit=2", base) == Replicas(2, 3, 2, 1)
    assert str(Replicas.parse("controlplane=2")) == (
        "gateway=1,filters=1,ratelimit=1,controlplane=2"
    )
    with pytest.raises(ValueError, match="ROLE one of"):
        Replicas.parse("envoy=2")
    with pytest.raises(ValueError, match=r"gateway: expected a count in 1\.\.16"):
        Replicas.parse("gateway=0")


def test_snapshot_versions_do_not_depend_on_the_process(tmp_path: Path) -> None:
    """Two control planes (two processes, two hash seeds) must publish the same versions, or an
    Envoy moving between them would be sent everything again. Maps inside packed Any fields
    (per-route filter configs, metadata) were serialized in insertion order, which followed
    set iteration: the versions differed per process."""
    (tmp_path / "p.yaml").write_text(SCALED)
    code = (
        "import sys; from policy import load_policy; "
        "from controlplane.reloader import snapshots_for; "
        "from controlplane.translate.render import render; "
        "print(sorted((g, s.version) for g, s in snapshots_for(render(load_policy(sys.argv[1]))).items()))"
    )
    seen = set()
    for seed in ("1", "2", "3"):
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "p.yaml")],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        seen.add(out.stdout)
    assert len(seen) == 1, seen
