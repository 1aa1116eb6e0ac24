"""``python -m filters`` as a process: serves gRPC and /metrics, reloads its policy, stops on
SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def policy(fp: int, keys: str) -> str:
    return f"""
version: 1
filters: {{address: 127.0.0.1:{fp}}}
pools: {{chat: {{models: [m1], endpoints: [127.0.0.1:9]}}}}
gateways:
  edge:
    routes:
      - name: llm
        pool: chat
        filters: {{plugins: [identity, lane]}}
tiers: {{pro: {{}}}}
tenants: {{alice: {{tier: pro, api_keys: [{keys}]}}}}
"""


async def status_for(port: int, key: str) -> int:
    headers = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=":path", raw_value=b"/v1/models"),
            base_pb2.HeaderValue(key="authorization", raw_value=f"Bearer {key}".encode()),
        ]
    )
    req = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=headers, end_of_stream=True))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = pb_grpc.ExternalProcessorStub(ch).Process(metadata=(("x-tokenweir-route", "llm"),))
        await call.write(req)
        resp = await call.read()
        await call.done_writing()
        call.cancel()
    assert isinstance(resp, pb.ProcessingResponse)
    return resp.immediate_response.status.code if resp.HasField("immediate_response") else 200


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


async def _metrics_once(port: int, line: str, timeout: float = 60.0) -> str:
    """The metrics page once it holds ``line`` (or at the timeout: the caller asserts)."""
    deadline = time.monotonic() + timeout
    while True:
        text = await asyncio.to_thread(_metrics, port)
        if line in text or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.2)


async def test_serve_reload_and_stop(tmp_path: Path) -> None:
    fp, mp = free_port(), free_port()
    path = tmp_path / "mesh.yaml"
    path.write_text(policy(fp, "old-key-1234"))
    argv = [sys.executable, "-m", "filters", "--policy", str(path), "--metrics-port", str(mp)]
    child = ChildProcess(argv, log=tmp_path / "filters.log")
    try:
        await asyncio.to_thread(wait_for_port, fp, 20.0)
        assert await status_for(fp, "old-key-1234") == 200
        assert await status_for(fp, "new-key-1234") == 401
        path.write_text(policy(fp, "new-key-1234"))
        deadline = time.monotonic() + 60  # the reload builds in a child at low priority: on a
        while time.monotonic() < deadline:  # loaded box that took over 6 s
            if await status_for(fp, "new-key-1234") == 200:
                break
            await asyncio.sleep(0.1)
        assert await status_for(fp, "new-key-1234") == 200, child.output()
        path.write_text("version: 1\npools: {broken")  # a bad edit keeps the running policy
        text = await _metrics_once(mp, "tokenweir_config_last_reload_error 1.0")
        assert await status_for(fp, "new-key-1234") == 200
        line = 'tokenweir_filters_rejections_total{reason="unauthorized",route="llm",status="401"} '
        assert line in text, text
        assert "tokenweir_config_last_reload_error 1.0" in text
        # a hostile edit (600 levels deep), then a fix: the watcher survives and applies the fix
        path.write_text("version: 1\nplanner: " + "[" * 600 + "]" * 600 + "\n")
        await asyncio.sleep(1.5)
        path.write_text(policy(fp, "third-key-1234"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if await status_for(fp, "third-key-1234") == 200:
                break
            await asyncio.sleep(0.1)
        assert await status_for(fp, "third-key-1234") == 200, child.output()
        text = urllib.request.urlopen(f"http://127.0.0.1:{mp}/metrics", timeout=5).read().decode()
        assert "tokenweir_config_last_reload_error 0.0" in text
        assert 'tokenweir_config_reloads_total{result="error"} 2.0' in text
        child.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(child.proc.wait, 10) == 0
        assert "policy rejected, last good config keeps serving" in child.output()
        assert "Traceback" not in child.output()
    finally:
        child.close()


async def test_worker_processes_share_the_port_and_stop_together(tmp_path: Path) -> None:
    fp = free_port()
    path = tmp_path / "mesh.yaml"
    path.write_text(policy(fp, "old-key-1234"))
    argv = [sys.executable, "-m", "filters", "--policy", str(path), "--processes", "2"]
    child = ChildProcess(argv, log=tmp_path / "filters.log")
    try:
        await asyncio.to_thread(wait_for_port, fp, 20.0)
        workers: list[int] = []
        for _ in range(100):
            workers = [
                int(p)
                for p in Path(f"/proc/{child.proc.pid}/task/{child.proc.pid}/children")
                .read_text()
                .split()
            ]
            if workers:
                break
            await asyncio.sleep(0.1)
        assert len(workers) == 1, "one extra worker process"
        for _ in range(400):  # requests during a worker's start could reach its half-open socket
            out = child.output()
            if all(f"filters[{i}] INFO filters.app: filter server on" in out for i in (0, 1)):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(child.output())
        results = await asyncio.gather(*(status_for(fp, "old-key-1234") for _ in range(20)))
        assert results == [200] * 20
        child.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(child.proc.wait, 15) == 0
        await asyncio.sleep(0.2)
        assert (
            not Path(f"/proc/{workers[0]}").exists()
            or "zombie" in Path(f"/proc/{workers[0]}/status").read_text()
        )
    finally:
        child.close()


async def test_every_worker_admits_its_share_of_the_pool(tmp_path: Path) -> None:
    """``--processes 2 --instances 2`` (two servers of two processes, as `up --replicas
    filters=2` with ``filters.processes: 2`` runs them): each process admits a quarter of the
    pool, the workers included (they run with ``--processes 1`` of their own)."""
    fp, mp = free_port(), free_port()
    path = tmp_path / "mesh.yaml"
    path.write_text(f"""
version: 1
filters: {{address: 127.0.0.1:{fp}}}
pools: {{chat: {{models: [m1], endpoints: [127.0.0.1:9], capacity: {{max_running_requests: 8}}}}}}
gateways: {{edge: {{routes: [{{name: llm, pool: chat, filters: {{plugins: [admission]}}}}]}}}}
""")
    argv = [sys.executable, "-m", "filters", "--policy", str(path), "--metrics-port", str(mp)]
    argv += ["--processes", "2", "--instances", "2"]
    child = ChildProcess(argv, log=tmp_path / "filters.log")
    try:
        limits: list[str] = []
        for _ in range(200):
            try:
                limits = [
                    line
                    for port in (mp, mp + 1)
                    for line in urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/metrics", timeout=2
                    )
                    .read()
                    .decode()
                    .splitlines()
                    if line.startswith("tokenweir_admission_limit{")
                ]
            except OSError:  # a worker not serving yet
                await asyncio.sleep(0.1)
                continue
            if len(limits) == 2:
                break
            await asyncio.sleep(0.1)
        assert limits == ['tokenweir_admission_limit{pool="chat"} 2.0'] * 2, child.output()
    finally:
        child.close()
