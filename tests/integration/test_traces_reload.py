"""The ``tracing`` section applies on a live policy reload, without a restart (issue 13): the
example mesh under ``tokenweir up`` (real Envoy, filter server, rate-limit service, emulators)
starts without it and a test OTLP receiver gets nothing; the policy file gains the section and
requests' spans arrive from Envoy, the filter server and the rate-limit service (no restart);
the section goes and the services stop making spans, even for a call that carries a
``traceparent`` straight to the rate-limit service."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from envoy.service.ratelimit.v3 import rls_pb2_grpc

from policy import load_policy
from tests.helpers import free_port
from tests.integration.example_mesh import example_policy
from tests.integration.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.integration.test_e2e_first_contact import call
from tests.integration.up_process import start_up, stop_up
from tests.ratelimit_service import rls

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HELLO = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
PYTHON = {"tokenweir-filters", "tokenweir-ratelimit"}
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def reloads(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(r'^tokenweir_config_reloads_total\{result="ok"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def direct_rls_call(address: str, rid: str) -> None:
    """A reservation straight to the rate-limit service, with a traceparent in its metadata."""
    with grpc.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        stub.ShouldRateLimit(
            rls.llm("demo-pro", 1, rid=rid, model="llama-3.1-8b"),
            metadata=(("traceparent", PARENT),),
            timeout=5,
        )


def services(spans: list[ReceivedSpan]) -> set[str]:
    return {s.service for s in spans}


def test_tracing_turns_on_and_off_with_the_policy(tmp_path: Path) -> None:
    # requests' spans: one chat replica, no batch API, sidecar or fallback pool (fewer processes)
    text, gw = example_policy(replicas=1, batch=False, sidecar=False, fallback=False)
    text = text.replace("message_timeout: 200ms", "message_timeout: 2s")  # a loaded 2-core box
    text = text.replace("timeout: 50ms", "timeout: 1s")
    policy_path = tmp_path / "mesh.yaml"
    policy_path.write_text(text)
    policy = load_policy(policy_path)
    assert policy.ratelimit is not None and policy.filters is not None
    rl_metrics, fs_metrics = policy.ratelimit.metrics_port, policy.filters.metrics_port
    assert rl_metrics is not None and fs_metrics is not None
    rl_address = str(policy.ratelimit.address)
    port = free_port()
    section = f"\ntracing: {{collector: 127.0.0.1:{port}, flush_interval: 200ms}}\n"
    url = f"http://127.0.0.1:{gw}/v1/chat/completions"

    def edit(new_text: str) -> None:
        """Write the policy and wait until both services have loaded it."""
        before = reloads(rl_metrics), reloads(fs_metrics)
        policy_path.write_text(new_text)
        deadline = time.monotonic() + 30
        while reloads(rl_metrics) <= before[0] or reloads(fs_metrics) <= before[1]:
            assert time.monotonic() < deadline, "the services never reloaded the policy"
            time.sleep(0.2)

    with OtlpReceiver(port) as rx:
        proc, banner = start_up(policy_path, tmp_path / "run", extra_args=("--fresh",))
        try:
            assert "tokenweir up: ready" in banner, banner
            # off: nothing is exported, even for a call that names a parent
            assert call(url, "tw-demo-pro-key", HELLO)[0] == 200
            direct_rls_call(rl_address, "off-1")
            time.sleep(1.0)
            assert rx.snapshot() == []

            # on: a live edit; Envoy (LDS) and both Python services trace the next requests
            edit(text + section)
            deadline = time.monotonic() + 60
            while not ({"edge"} | PYTHON) <= services(rx.snapshot()):
                assert time.monotonic() < deadline, services(rx.snapshot())
                assert call(url, "tw-demo-pro-key", HELLO)[0] == 200
                time.sleep(0.5)
            direct_rls_call(rl_address, "on-1")
            deadline = time.monotonic() + 10
            while not [s for s in rx.snapshot() if s.trace_id == PARENT.split("-")[1]]:
                assert time.monotonic() < deadline, "the direct call made no span while on"
                time.sleep(0.2)

            # off again: the services make no span, whatever a call carries
            edit(text)
            time.sleep(6.0)  # Envoy flushes every 5 s; the services' old tracers flush at once
            seen = len(rx.snapshot())
            for i in range(3):
                assert call(url, "tw-demo-pro-key", {**HELLO, "user": f"off{i}"})[0] == 200
                direct_rls_call(rl_address, f"off-again-{i}")
            time.sleep(6.0)
            later = rx.snapshot()[seen:]
            assert services(later) & PYTHON == set(), [(s.service, s.name) for s in later]
            assert proc.poll() is None  # nothing died (up ends when a service exits)
        finally:
            stop_up(proc)
