"""The port plan (policy.ports): every port of the mesh, one check, a fix that works."""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

import pytest

from policy import PolicyError, load_policy, load_policy_text
from policy.ports import port_clashes, port_plan
from policy.servers import Replicas
from runtime.ports import free_port
from tokenweir.cli import main
from tokenweir.up_cli import port_problems, ports_taken

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_MD = "gateway=3,filters=2,ratelimit=2,controlplane=2"  # docs/deploy.md's command
# examples/mesh.yaml's server ports before the port plan (the layout of the bug report)
OLD_LAYOUT = {
    "control_plane.xds": "127.0.0.1:18000",
    "control_plane.metrics": "127.0.0.1:18001",
    "ratelimit.address": "127.0.0.1:18081",
    "ratelimit.metrics_port": "18091",
    "filters.address": "127.0.0.1:18082",
    "filters.metrics_port": "18096",
}


def _text(values: dict[str, str], replicas: str = "") -> str:
    v = {k.replace(".", "_"): x for k, x in values.items()}
    rep = f"replicas: {{{replicas.replace('=', ': ')}}}\n" if replicas else ""
    return f"""version: 1
{rep}control_plane: {{xds: "{v["control_plane_xds"]}", metrics: "{v["control_plane_metrics"]}"}}
ratelimit: {{address: "{v["ratelimit_address"]}", metrics_port: {v["ratelimit_metrics_port"]}}}
filters: {{address: "{v["filters_address"]}", metrics_port: {v["filters_metrics_port"]}}}
"""


def _messages(values: dict[str, str], replicas: str) -> list[tuple[str, str]]:
    policy = load_policy_text(_text(values))  # one of each: no clash
    policy = dataclasses.replace(policy, replicas=Replicas.parse(replicas))
    return [(c.key, c.message) for c in port_clashes(port_plan(policy))]


def test_deploy_md_replicas_on_the_old_layout_name_both_users_and_the_fix() -> None:
    clashes = _messages(OLD_LAYOUT, DEPLOY_MD)
    assert clashes == [
        (
            "control_plane.metrics",
            "port 18001 is claimed twice: by control plane#1 (xDS, control_plane.xds) and by "
            "control plane#0 (metrics, control_plane.metrics); fix: set control_plane.metrics "
            "to 127.0.0.1:18002, or control_plane.xds to 127.0.0.1:18003, or run fewer control "
            "plane replicas",
        ),
        (
            "filters.address",
            "port 18082 is claimed twice: by ratelimit#1 (gRPC, ratelimit.address) and by "
            "filters#0 (gRPC, filters.address); fix: set filters.address to 127.0.0.1:18083, "
            "or ratelimit.address to 127.0.0.1:18084, or run fewer ratelimit replicas",
        ),
    ]


@pytest.mark.parametrize("replicas", [DEPLOY_MD, "ratelimit=3,filters=4", "controlplane=5"])
def test_every_suggested_fix_removes_its_clash(replicas: str) -> None:
    clashes = _messages(OLD_LAYOUT, replicas)
    assert clashes
    for _, message in clashes:
        fixes = re.findall(r"(?:set )?(\S+) to (\S+?)(?:,|$)", message.partition("fix: ")[2])
        assert fixes, message
        for fixed_key, value in fixes:
            moved = {**OLD_LAYOUT, fixed_key: value}
            after = _messages(moved, replicas)
            # that key clashes no more (others of the layout may, each with its own fix)
            assert all(fixed_key not in m.partition("; fix")[0] for _, m in after), (value, after)


def test_the_policy_file_gets_the_same_check_with_its_line() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy_text(_text(OLD_LAYOUT, "ratelimit=2"), "m.yaml")
    (issue,) = info.value.issues
    assert (issue.line, issue.path) == (5, "filters.address")
    assert "by ratelimit#1 (gRPC, ratelimit.address)" in issue.message


def test_metrics_ports_per_process_and_replica_are_planned() -> None:
    values = {**OLD_LAYOUT, "filters.metrics_port": "18093", "ratelimit.metrics_port": "18095"}
    text = _text(values).replace("metrics_port: 18093", "metrics_port: 18093, processes: 2")
    policy = dataclasses.replace(load_policy_text(text), replicas=Replicas.parse("filters=2"))
    plan = [c.port for c in port_plan(policy) if c.key == "filters.metrics_port"]
    assert plan == [18093, 18094, 18095, 18096]  # replica r's process w on 18093 + 2r + w
    assert [c.message for c in port_clashes(port_plan(policy))] == [
        "port 18095 is claimed twice: by ratelimit (metrics of process 0, "
        "ratelimit.metrics_port) and by filters#1 (metrics of process 0, filters.metrics_port); "
        "fix: set filters.metrics_port to 18096, or ratelimit.metrics_port to 18097, "
        "or run fewer filters replicas"
    ]


def test_the_example_runs_the_deploy_md_command_without_a_clash() -> None:
    policy = load_policy(ROOT / "examples" / "mesh.yaml")
    assert port_problems(policy, Replicas.parse(DEPLOY_MD)) == []
    assert port_problems(policy, None) == []


def test_up_flags_are_checked_against_the_plan() -> None:
    policy = load_policy_text(_text(OLD_LAYOUT))
    (problem,) = port_problems(policy, Replicas.parse("ratelimit=2"))
    assert problem.startswith(
        "--replicas gateway=1,filters=1,ratelimit=2,controlplane=1: filters.address: port 18082"
    )
    (problem,) = port_problems(policy, None, prometheus_port=18096)
    assert problem.startswith("--prometheus-port 18096: port already used by filters (metrics")


def test_up_refuses_clashing_replicas_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mesh.yaml").write_text(_text(OLD_LAYOUT))
    run, state = tmp_path / "run", tmp_path / "state"
    argv = ["up", "-c", str(tmp_path / "mesh.yaml"), "--run-dir", str(run)]
    rc = main([*argv, "--state-dir", str(state), "--replicas", DEPLOY_MD, "--no-prometheus"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "control_plane.metrics: port 18001 is claimed twice" in err
    assert "filters.address: port 18082 is claimed twice" in err
    assert "2 port clash(es); nothing started" in err
    assert not run.exists() and not state.exists()  # no lock taken, no child started


def test_up_refuses_a_port_another_process_listens_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Something else listens where an emulator would: `up` said ready (the stranger answered
    the readiness check) while the emulator failed to bind again and again and the gateway
    answered `no_healthy_upstream`. Now nothing starts, and the error names the key."""
    xds, metrics, gateway = (free_port() for _ in range(3))
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    held = stranger.getsockname()[1]
    path = tmp_path / "mesh.yaml"
    path.write_text(
        f"version: 1\n"
        f"control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{metrics}}}\n"
        f"pools:\n  chat:\n    models: [m1]\n"
        f"    emulated: {{replicas: 1, profile: llama-3.1-8b-h100, base_port: {held}}}\n"
        f"gateways:\n  edge:\n    listen: 127.0.0.1:{gateway}\n"
        f"    routes: [{{name: llm, match: {{prefix: /v1/}}, pool: chat}}]\n"
    )
    run = tmp_path / "run"
    argv = ["up", "-c", str(path), "--run-dir", str(run), "--state-dir", str(tmp_path / "s")]
    try:
        rc = main([*argv, "--no-prometheus"])
        err = capsys.readouterr().err
        assert rc == 1, err
        assert (
            f"{path}: pools.chat.emulated.base_port: 127.0.0.1:{held} (emulator chat#0, HTTP) "
            "is already in use by another process" in err
        ), err
        assert "1 port(s) in use; nothing started" in err
        assert not run.exists()  # no child started
    finally:
        stranger.close()
    assert ports_taken(path, load_policy(path), None) == []  # the port is free again
