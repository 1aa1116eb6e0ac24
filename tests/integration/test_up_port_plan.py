"""docs/deploy.md's `tokenweir up -c examples/mesh.yaml --replicas ...`, as printed: the mesh
starts with every replica on a port of its own, and requests are rated and served.

Before the port plan, this command put rate-limit replica 1 and filter server 0 on one port and
control plane 1's xDS on control plane 0's metrics port: ext_proc calls reached the rate-limit
service (500 `unknown_method`) and rate-limit calls the filter server (unrated requests).

The example's ports are moved to free ones here (other meshes may run on this machine), with
each group of neighbouring ports moved together so the layout the command meets is the file's.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port_block
from tests.integration.up_process import ROOT, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_PORT = re.compile(r"(127\.0\.0\.1:|metrics_port: |base_port: )(\d{4,5})\b")


def deploy_md_replicas() -> str:
    text = (ROOT / "docs" / "deploy.md").read_text()
    m = re.search(r"tokenweir up -c examples/mesh\.yaml --replicas (\S+)", text)
    assert m, "docs/deploy.md no longer shows the --replicas command"
    return m.group(1)


def moved_example() -> str:
    """examples/mesh.yaml with each block of 100 ports (18000-18099, 30000-30099, ...) moved to a
    free block as a whole: the distances between the file's own ports stay as written."""
    text = (ROOT / "examples" / "mesh.yaml").read_text()
    blocks: dict[int, int] = {}

    def move(m: re.Match[str]) -> str:
        port = int(m.group(2))
        if port // 100 not in blocks:
            blocks[port // 100] = free_port_block(100)
        return f"{m.group(1)}{blocks[port // 100] + port % 100}"

    return _PORT.sub(move, text)


def _chat(gw: int, key: str) -> tuple[int, dict[str, str], bytes]:
    body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}]}
    req = urllib.request.Request(
        f"http://127.0.0.1:{gw}/v1/chat/completions",
        data=json.dumps({**body, "max_tokens": 256}).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_deploy_md_replicas_command_starts_and_rates_requests(tmp_path: Path) -> None:
    policy = tmp_path / "mesh.yaml"
    policy.write_text(moved_example())
    gw = int(re.search(r"listen: 127\.0\.0\.1:(\d+)", policy.read_text()).group(1))  # type: ignore[union-attr]
    replicas = deploy_md_replicas()
    proc, banner = start_up(
        policy, tmp_path / "run", 180, ("--fresh", "--state-dir", str(tmp_path / "state"),
        "--replicas", replicas, "--drain-timeout", "1"),
    )  # fmt: skip
    try:
        assert "tokenweir up: ready" in banner, banner
        servers = re.findall(r"#\d+\s+(?:xDS )?grpc://(\S+)", banner)
        assert len(servers) == 6, banner  # 2 rate-limit services, 2 filter servers, 2 planes
        ports = servers + re.findall(r"metrics http://(\S+)/metrics", banner)
        assert len(ports) == len(set(ports)) >= 10, banner  # each on a port of its own
        status, _, answer = _chat(gw, "tw-demo-pro-key")
        assert status == 200, answer
        assert json.loads(answer)["choices"][0]["message"]["content"]
        # the free tenant's 2,000-token bucket: a few requests of 256 tokens, then 429s
        statuses = []
        for _ in range(12):
            status, headers, answer = _chat(gw, "tw-demo-free-key")
            statuses.append(status)
            if status == 429:
                assert {k.lower() for k in headers} >= {"retry-after"}, headers
        assert set(statuses) <= {200, 429}, statuses  # no 500 from a cross-wired ext_proc
        assert 200 in statuses and statuses[-1] == 429, statuses  # rated, then refused
    finally:
        rest = stop_up(proc, timeout=60)
    assert proc.returncode == 0, banner + rest
