"""Nothing an operator did is lost (issue 9, item 8): `tokenweir up` keeps its Redis data in a
state directory reused across runs. A quota edit and a key revocation made live (with
`tokenweir quota` / `tokenweir keys`, which find the running mesh's Redis by themselves) still
hold after `up` is stopped and started again; `--fresh` starts empty."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.example_mesh import example_policy
from tests.integration.test_e2e_first_contact import call
from tests.integration.up_process import ROOT, TOKENWEIR, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HELLO = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOKENWEIR), *argv], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def burst(policy: Path) -> object:
    done = cli("quota", "-c", str(policy), "--json", "get", "demo-free")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["fields"]["tokens.burst"]


def test_live_edits_survive_a_restart_of_up(tmp_path: Path) -> None:
    # the quotas and keys an operator edits: one chat replica, no batch API, sidecar or fallback pool (fewer processes)
    text, gw = example_policy(replicas=1, batch=False, sidecar=False, fallback=False)
    policy = tmp_path / "mesh.yaml"
    policy.write_text(text)
    url = f"http://127.0.0.1:{gw}/v1/chat/completions"
    proc, banner = start_up(policy, tmp_path / "run1")
    try:
        assert "tokenweir up: ready" in banner, banner
        state = tmp_path / ".tokenweir" / "state"
        assert f"data kept in {state / 'redis'}" in banner
        # live edits, with no --redis-url: the CLIs find the running mesh's Redis
        done = cli("quota", "-c", str(policy), "set", "demo-free", "tokens.burst=4321")
        assert done.returncode == 0, done.stderr
        assert cli("keys", "-c", str(policy), "revoke", "tw-demo-pro-key").returncode == 0
        done = cli("keys", "-c", str(policy), "set", "sk-live-issued-key", "demo-pro")
        assert done.returncode == 0, done.stderr
        assert burst(policy) == {"value": "4321", "source": "live edit"}
        assert call(url, "tw-demo-pro-key", HELLO)[0] == 401
        assert call(url, "sk-live-issued-key", HELLO)[0] == 200
    finally:
        stop_up(proc)

    # stopped: the error names the URL tried and the flag to change it
    done = cli("quota", "-c", str(policy), "get", "demo-free")
    assert done.returncode == 1
    assert "redis://127.0.0.1:6379/0" in done.stderr and "--redis-url" in done.stderr
    assert "no running `tokenweir up` found" in done.stderr

    proc, banner = start_up(policy, tmp_path / "run2")
    try:
        assert "tokenweir up: ready" in banner, banner
        assert burst(policy) == {"value": "4321", "source": "live edit"}
        shown = cli("keys", "-c", str(policy), "show", "tw-demo-pro-key")
        assert json.loads(shown.stdout) == {"disabled": "1"}, shown.stderr
        assert call(url, "tw-demo-pro-key", HELLO)[0] == 401  # the policy still lists it
        assert call(url, "sk-live-issued-key", HELLO)[0] == 200
        assert call(url, "tw-demo-free-key", HELLO)[0] == 200
        # a second `up` on the same state directory is refused (one Redis per append-only file)
        second = subprocess.run(
            [str(TOKENWEIR), "up", "-c", str(policy), "--run-dir", str(tmp_path / "run3")],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert second.returncode == 1 and "another `tokenweir up`" in second.stderr
    finally:
        stop_up(proc)

    proc, banner = start_up(policy, tmp_path / "run4", extra_args=("--fresh",))
    try:
        assert "tokenweir up: ready" in banner, banner
        assert burst(policy)["source"] == "policy"  # type: ignore[index]
        assert call(url, "tw-demo-pro-key", HELLO)[0] == 200
    finally:
        stop_up(proc)
