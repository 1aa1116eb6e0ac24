"""Drain on SIGTERM with real processes (issue 9, item 11).

- ``python -m filters`` (grpc.aio and h2 transports): ``grpc.health.v1.Health/Check`` answers SERVING,
  then NOT_SERVING once SIGTERM arrives; an ext_proc stream opened before keeps being answered
  to its end while a new one is refused (UNAVAILABLE); then the process exits 0, no traceback.
- ``--processes 2``: the supervisor's worker gets the signal too; all exit 0, no traceback.
- ``python -m ratelimit_service`` (grpc.aio): health SERVING, SIGTERM → exit 0, no traceback.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers import ChildProcess, free_port, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _policy(fp: int, rp: int) -> str:
    return f"""
version: 1
filters: {{address: 127.0.0.1:{fp}}}
ratelimit: {{address: 127.0.0.1:{rp}}}
pools: {{chat: {{models: [m1], endpoints: [127.0.0.1:9]}}}}
gateways:
  edge:
    routes:
      - name: llm
        pool: chat
        filters: {{plugins: [lane, usage]}}
"""


async def health(port: int, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        req = health_pb2.HealthCheckRequest(service=service)
        resp = await health_pb2_grpc.HealthStub(ch).Check(req, timeout=5)
        return int(resp.status)


def _headers() -> pb.ProcessingRequest:
    hm = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
            base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
        ]
    )
    return pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hm, end_of_stream=False))


def _chunk(data: bytes, end: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=end))


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text, text[-3000:]


def _start(module: str, tmp_path: Path, *args: str) -> ChildProcess:
    argv = [sys.executable, "-m", module, "--policy", str(tmp_path / "mesh.yaml"), *args]
    return ChildProcess(argv, log=tmp_path / f"{module}.log")


def _wait_exit(child: ChildProcess, timeout: float = 20.0) -> int:
    try:
        return child.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {timeout}s after SIGTERM:\n{child.output()[-3000:]}")


@pytest.mark.parametrize("transport", ["grpc", "h2"])
async def test_filter_server_drains_streams_in_flight_and_reports_not_serving(
    tmp_path: Path, transport: str
) -> None:
    fp = free_port()
    (tmp_path / "mesh.yaml").write_text(_policy(fp, free_port()))
    child = _start("filters", tmp_path, "--transport", transport, "--drain-timeout", "60")
    try:
        wait_for_port(fp)
        assert await health(fp) == SERVING
        assert await health(fp, "envoy.service.ext_proc.v3.ExternalProcessor") == SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fp}") as ch:
            stub = pb_grpc.ExternalProcessorStub(ch)
            old = stub.Process(metadata=(("x-tokenweir-route", "llm"),))
            await old.write(_headers())
            assert (await old.read()).HasField("request_headers")

            child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while await health(fp) != NOT_SERVING:  # health keeps answering while draining
                assert time.monotonic() < deadline, "never reported NOT_SERVING"
                await asyncio.sleep(0.05)
            assert await health(fp, "envoy.service.ext_proc.v3.ExternalProcessor") == NOT_SERVING

            new = stub.Process(metadata=(("x-tokenweir-route", "llm"),))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await new.write(_headers())
                await new.read()
            # refused: UNAVAILABLE. Two client-side races report INTERNAL "Internal error from
            # Core" instead (both seen in fresh-clone CI runs): grpc.aio's own server, stopping,
            # resets the new stream before its status arrives; and the h2 transport's refusal
            # (GOAWAY, then RST_STREAM REFUSED_STREAM at the new stream's headers) can end the
            # stream while the client's first message is still being sent, and grpc.aio then
            # overwrites the call's status with its failed send ("SendMessageOperation")
            allowed = {grpc.StatusCode.UNAVAILABLE}
            failed_send = "SendMessageOperation" in (refused.value.debug_error_string() or "")
            if transport == "grpc" or failed_send:
                allowed.add(grpc.StatusCode.INTERNAL)
            assert refused.value.code() in allowed, refused.value

            # the stream opened before the signal is still served, chunk after chunk
            for i in range(3):
                await old.write(_chunk(b'data: {"n": %d}\n\n' % i, end=False))
                assert (await old.read()).HasField("response_body")
                assert child.alive()
            await old.write(_chunk(b"data: [DONE]\n\n", end=True))
            assert (await old.read()).HasField("response_body")
            await old.done_writing()
        assert _wait_exit(child) == 0
    finally:
        child.close()
    out = child.log.read_text()
    _no_traceback(out)
    assert "SIGTERM: draining" in out


def test_supervised_workers_get_the_signal_and_exit_cleanly(tmp_path: Path) -> None:
    fp = free_port()
    (tmp_path / "mesh.yaml").write_text(_policy(fp, free_port()))
    child = _start("filters", tmp_path, "--transport", "grpc", "--processes", "2")
    try:
        wait_for_port(fp)
        deadline = time.monotonic() + 20
        while child.output().count("filter server on") < 2:  # both workers listening
            assert time.monotonic() < deadline, child.output()
            time.sleep(0.1)
        worker = _worker_pid(child.proc.pid)
        child.proc.send_signal(signal.SIGTERM)
        assert _wait_exit(child) == 0
        assert not Path(f"/proc/{worker}").exists() or _zombie(worker)
    finally:
        child.close()
    out = child.log.read_text()
    _no_traceback(out)
    assert "filters[0]" in out and "filters[1]" in out
    assert out.count("SIGTERM: draining") == 2  # the supervisor and its worker, once each


def test_rate_limit_service_answers_health_and_stops_cleanly(tmp_path: Path) -> None:
    rp = free_port()
    (tmp_path / "mesh.yaml").write_text(_policy(free_port(), rp))
    child = _start("ratelimit_service", tmp_path, "--transport", "grpc")
    try:
        wait_for_port(rp)
        assert asyncio.run(health(rp, "envoy.service.ratelimit.v3.RateLimitService")) == SERVING
        child.proc.send_signal(signal.SIGINT)
        assert _wait_exit(child) == 0
    finally:
        child.close()
    _no_traceback(child.log.read_text())


def _worker_pid(parent: int) -> int:
    kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    assert len(kids) == 1, kids
    return int(kids[0])


def _zombie(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] == "Z"


def test_control_plane_serve_answers_health_and_stops_cleanly(tmp_path: Path) -> None:
    xds, metrics = free_port(), free_port()
    (tmp_path / "mesh.yaml").write_text(
        _policy(free_port(), free_port())
        + f"control_plane: {{xds: 127.0.0.1:{xds}, metrics: 127.0.0.1:{metrics}}}\n"
    )
    tokenweir = Path(sys.executable).parent / "tokenweir"
    argv = [str(tokenweir), "serve", "-c", str(tmp_path / "mesh.yaml")]
    child = ChildProcess(argv, log=tmp_path / "serve.log")
    try:
        wait_for_port(xds, timeout=60.0)  # a loaded box starts Python slowly
        ads = "envoy.service.discovery.v3.AggregatedDiscoveryService"
        assert asyncio.run(health(xds, ads)) == SERVING
        wait_for_port(metrics)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=5) as r:
            assert r.status == 200
        child.proc.send_signal(signal.SIGTERM)
        assert _wait_exit(child) == 0
    finally:
        child.close()
    out = child.log.read_text()
    _no_traceback(out)
    assert "SIGTERM: draining" in out and "stopped after" in out
