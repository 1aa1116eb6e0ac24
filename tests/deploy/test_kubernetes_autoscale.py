"""deploy/kubernetes autoscaling (issue 42): the HPA (prometheus-adapter external metric) and
the KEDA ScaledObject follow the metric the control plane really publishes for the pool the
policy autoscales, with the policy's bounds and a replica count equal to the metric; scale-down
drains (preStop outlasts the DNS, Envoy and scraper refresh; the grace period outlasts preStop
and the drain); the autoscaled policy is the base policy but for the pool's endpoints and
``autoscale:``. The builds themselves are validated in test_kubernetes.py (BUILDS)."""

from __future__ import annotations

import dataclasses
import re

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from controlplane.autoscale import Autoscaler
from controlplane.saturation.fetch import _DNS_TTL_S
from controlplane.translate.dns import DNS_REFRESH_S
from policy import Policy, load_policy_text
from tests.deploy.test_kubernetes import KUBE, VERSIONS, Doc, build, containers, named, of_kind

HPA, KEDA = "overlays/autoscale-hpa", "overlays/autoscale-keda"
METRIC = "tokenweir_pool_desired_replicas"


def policy_of(docs: tuple[Doc, ...]) -> Policy:
    return load_policy_text(
        named(docs, "ConfigMap", "tokenweir-policy")["data"]["mesh.yaml"], gateway_files=False
    )


def published(policy: Policy) -> dict[str, dict[str, str]]:
    """The desired-replica series the control plane exports for ``policy``: name → labels."""
    registry = CollectorRegistry()
    scaler = Autoscaler(clock=lambda: 1000.0, registry=registry)
    scaler.configure(policy)
    scaler.tick()
    return {
        s.labels["pool"]: dict(s.labels)
        for m in registry.collect()
        for s in m.samples
        if s.name == METRIC
    }


def _arg(c: Doc, flag: str) -> str:
    return c["args"][c["args"].index(flag) + 1]


def test_the_autoscaled_policy_is_the_base_policy_but_for_the_pool() -> None:
    base = load_policy_text((KUBE / "base/policy/mesh.yaml").read_text(), gateway_files=False)
    scaled = load_policy_text(
        (KUBE / "components/autoscale/mesh.yaml").read_text(), gateway_files=False
    )
    (name,) = [n for n, p in scaled.pools.items() if p.autoscale is not None]
    pool = scaled.pools[name]
    unscaled = dataclasses.replace(pool, autoscale=None, endpoints=base.pools[name].endpoints)
    assert dataclasses.replace(scaled, pools={**scaled.pools, name: unscaled}) == base
    assert set(base.pools[name].endpoints) < set(pool.endpoints)


@pytest.mark.parametrize("overlay", [HPA, KEDA])
def test_the_autoscaler_follows_the_published_metric_one_replica_per_unit(overlay: str) -> None:
    docs = build(overlay)
    policy = policy_of(docs)
    series = published(policy)
    (pool,) = [n for n, p in policy.pools.items() if p.autoscale is not None]
    bounds = policy.pools[pool].autoscale
    assert bounds is not None and set(series[pool]) == {"pool", "reason"}
    sts = named(docs, "StatefulSet", "sglang-chat")
    ns = sts["metadata"]["namespace"]
    if overlay == HPA:
        (hpa,) = of_kind(docs, "HorizontalPodAutoscaler")
        spec = hpa["spec"]
        (metric,) = spec["metrics"]
        ext = metric["external"]
        assert ext["metric"]["name"] == METRIC
        assert ext["metric"]["selector"] == {"matchLabels": {"pool": pool}}
        assert ext["target"] == {"type": "AverageValue", "averageValue": "1"}
        lo, hi = spec["minReplicas"], spec["maxReplicas"]
        behavior = spec["behavior"]
        # prometheus-adapter serves the metric under that name, aggregated per pool
        rules = named(docs, "ConfigMap", "tokenweir-prometheus-adapter-rules")
        (rule,) = yaml.safe_load(rules["data"]["config.yaml"])["externalRules"]
        assert METRIC in rule["seriesQuery"] and rule["name"]["as"] == METRIC
        assert re.match(rf"^{rule['name']['matches']}", METRIC)
        assert re.fullmatch(r"max by \(pool\) \(<<\.Series>>\{<<\.LabelMatchers>>\}\)",
                            rule["metricsQuery"])  # fmt: skip
        assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    else:
        (so,) = of_kind(docs, "ScaledObject")
        spec = so["spec"]
        (trigger,) = spec["triggers"]
        assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
        meta = trigger["metadata"]
        assert meta["threshold"] == "1" and meta["serverAddress"].startswith("http")
        assert meta["query"] == f'max({METRIC}{{namespace="{ns}",pool="{pool}"}})'
        lo, hi = spec["minReplicaCount"], spec["maxReplicaCount"]
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        target = spec["scaleTargetRef"]
        assert named(docs, target["kind"], target["name"]) is sts
        # KEDA hands this behavior to the HPA it creates: it must be a valid HPA behavior
        for version in VERSIONS:
            kubernetes_validate.validate(
                {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                 "metadata": {"name": "x"},
                 "spec": {"scaleTargetRef": target, "maxReplicas": hi, "behavior": behavior}},
                version, strict=True,
            )  # fmt: skip
    assert (lo, hi) == (max(bounds.min_replicas, 1), bounds.max_replicas)
    # the planner damps already: no second stabilization window behind it
    for direction in ("scaleUp", "scaleDown"):
        assert behavior[direction]["stabilizationWindowSeconds"] == 0


@pytest.mark.parametrize("overlay", [HPA, KEDA])
def test_scale_down_drains_and_only_ready_pods_have_names(overlay: str) -> None:
    docs = build(overlay)
    policy = policy_of(docs)
    sts = named(docs, "StatefulSet", "sglang-chat")
    svc = named(docs, "Service", sts["spec"]["serviceName"])
    # a pod not ready (starting, loading, terminating) has no DNS name: absent from the pool
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is False
    (sglang,) = containers(sts)
    pre_stop = sglang["lifecycle"]["preStop"]["sleep"]["seconds"]
    # the name is gone everywhere before SIGTERM: CoreDNS TTL (5 s) + Envoy's refresh + the
    # scraper's DNS cache, each at most once
    assert pre_stop >= 5 + DNS_REFRESH_S + _DNS_TTL_S
    drain = float(_arg(sglang, "--drain-timeout"))
    bounds = policy.pools["chat"].autoscale
    assert bounds is not None and bounds.drain_timeout == drain
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + drain + 10, "SIGKILL would cut streams still draining"
