"""`tokenweir up` end to end: a real mesh from one policy file; SIGINT stops every child."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port, free_port_block
from tests.integration.up_process import ROOT, TOKENWEIR, start_up, stop_up

pytestmark = pytest.mark.integration


def _policy(gw: int, base: int) -> str:
    xds, metrics = free_port(), free_port()
    return f"""
version: 1
control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{metrics}}}
pools:
  chat:
    models: [llama-3.1-8b]
    emulated: {{replicas: 2, profile: llama-3.1-8b-h100, base_port: {base}, time_scale: 0.05}}
    health_check: {{interval: 1s}}
gateways:
  edge:
    listen: 127.0.0.1:{gw}
    routes:
      - {{name: chat, pool: chat, match: {{prefix: /}}}}
"""


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(
        ["ps", "-e", "-o", "pid=,ppid=,pgid="], capture_output=True, text=True
    ).stdout
    rows = [tuple(int(x) for x in line.split()) for line in out.splitlines() if line.strip()]
    kids: set[int] = set()
    frontier = {pid}
    while frontier:
        nxt = {p for p, pp, _ in rows if pp in frontier} - kids
        kids |= nxt
        frontier = nxt
    return kids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def test_up_serves_through_envoy_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    base = free_port_block(2)
    gw = free_port()
    (tmp_path / "mesh.yaml").write_text(_policy(gw, base))
    proc, banner = start_up(tmp_path / "mesh.yaml", tmp_path / "run")
    try:
        assert "mesh running" in banner and "ready" in banner, banner
        assert (
            f"http://127.0.0.1:{gw}" in banner
            and f"http://127.0.0.1:{base}" in banner
            and "admin http://" in banner
        )
        children = _descendants(proc.pid)
        assert len(children) >= 3, children  # 2 emulators + envoy
        body = json.dumps(
            {
                "model": "llama-3.1-8b",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            }
        )
        req = urllib.request.Request(
            f"http://127.0.0.1:{gw}/v1/chat/completions", data=body.encode(),
            headers={"content-type": "application/json", "x-session-id": "s1"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
        assert answer["choices"][0]["message"]["content"]
        assert answer["usage"]["completion_tokens"] == 4
    finally:
        rest = stop_up(proc)
    assert proc.returncode == 0, banner + rest
    time.sleep(0.2)
    left = [p for p in children if _alive(p)]
    assert not left, f"processes left running after Ctrl-C: {left}"


def test_up_refuses_a_bad_policy_with_its_errors(tmp_path: Path) -> None:
    bad = ROOT / "tests/policy/bad/dangling_pool.yaml"
    proc = subprocess.run(
        [str(TOKENWEIR), "up", "-c", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert f"{bad}:10: gateways.edge.routes[0].pool: unknown pool 'chatt'" in proc.stderr


def test_validate_and_render_cli(tmp_path: Path) -> None:
    good = ROOT / "tests/controlplane/translate/golden/mesh.yaml"
    ok = subprocess.run(
        [str(TOKENWEIR), "validate", str(good)], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and "OK" in ok.stdout
    bad = ROOT / "tests/policy/bad/unknown_key.yaml"
    rej = subprocess.run(
        [str(TOKENWEIR), "validate", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert rej.returncode == 1 and "pools.chat.affinty: unknown key" in rej.stderr
    out = subprocess.run(
        [str(TOKENWEIR), "render", str(good), "--node", "edge"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    rendered = json.loads(out.stdout)
    assert set(rendered) == {"edge"} and "pool_chat" in rendered["edge"]["Cluster"]


def test_children_die_with_a_killed_up(tmp_path: Path) -> None:
    base = free_port_block(2)
    (tmp_path / "mesh.yaml").write_text(_policy(free_port(), base))
    proc, banner = start_up(tmp_path / "mesh.yaml", tmp_path / "run")
    try:
        assert "tokenweir up: ready" in banner, banner
        children = _descendants(proc.pid)
        assert children
    finally:
        stop_up(proc, kill=True)  # no chance to clean up
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.1)
    assert not [p for p in children if _alive(p)], "children outlived a SIGKILLed `tokenweir up`"
