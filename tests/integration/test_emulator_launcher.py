"""The SGLang launcher's lifecycle, with the emulator standing in for ``sglang.launch_server``
(it accepts the same flags), and the gateway smoke test: on CPU against the emulator, and on a
GPU host (marked ``gpu``) against a real SGLang server with a small model."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from backends.errors import LauncherError
from backends.sglang import LaunchConfig, SGLangLauncher, read_endpoints
from tests.helpers import ChildProcess, envoy_base_id, free_port, wait_for_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ENVOY = ROOT / ".venv" / "bin" / "envoy"
GPU_MODEL = os.environ.get("TOKENWEIR_GPU_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")


def _cuda_available() -> bool:
    if importlib.util.find_spec("sglang") is None or shutil.which("nvidia-smi") is None:
        return False
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return out.returncode == 0 and "GPU" in out.stdout


def _emulator_config(tmp_path: Path, **changes: object) -> LaunchConfig:
    base = {
        "model_path": "emulated-model",
        "port": free_port(),
        "pool_file": tmp_path / "pools" / "chat.endpoints",
        "server_module": "backends.emulator",
        "max_running_requests": 8,
        "max_total_tokens": 50_000,
        "extra_args": ("--profile", "seed-2k", "--time-scale", "0.05"),
        "health_timeout_s": 30.0,
        "drain_timeout_s": 20.0,
        "log_file": tmp_path / "server.log",
    }
    base.update(changes)
    return LaunchConfig(**base)  # type: ignore[arg-type]


async def test_launch_registers_reports_capacity_and_drains_before_stopping(
    tmp_path: Path,
) -> None:
    cfg = _emulator_config(tmp_path)
    launcher = SGLangLauncher(cfg)
    hints = await launcher.start()
    try:
        assert (hints.max_total_tokens, hints.max_running_requests) == (50_000, 8)
        assert read_endpoints(cfg.pool_file) == [cfg.endpoint]
        assert cfg.endpoint in cfg.capacity_file.read_text()
        async with aiohttp.ClientSession() as http:
            body = {"text": "a b", "sampling_params": {"max_new_tokens": 60}, "stream": True}
            async with http.post(cfg.url + "/generate", json=body) as r:
                await r.content.readline()
                closing = asyncio.create_task(launcher.aclose())
                await asyncio.sleep(0.1)
                assert read_endpoints(cfg.pool_file) == []  # deregistered first
                assert not closing.done()  # ... and waiting for the running request
                lines = [line async for line in r.content]
            assert lines[-2].strip() == b"data: [DONE]"  # it finished normally
            await asyncio.wait_for(closing, 20)
        assert launcher.pid is None
        assert cfg.endpoint not in cfg.capacity_file.read_text()
    finally:
        await launcher.aclose()


async def test_launch_failure_is_reported_and_nothing_is_registered(tmp_path: Path) -> None:
    cfg = _emulator_config(tmp_path, extra_args=("--profile", "no-such-profile"))
    with pytest.raises(LauncherError, match="exited"):
        await SGLangLauncher(cfg).start()
    assert read_endpoints(cfg.pool_file) == []
    missing = _emulator_config(tmp_path, server_module="no_such_module_xyz.launch_server")
    with pytest.raises(LauncherError, match="not installed"):
        await SGLangLauncher(missing).start()


def _envoy_bootstrap(listen: int, admin: int, backend: int) -> str:
    return f"""
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: gateway
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: pool, timeout: 0s}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: pool
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: pool
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {backend}}}}}}}
"""


@pytest.fixture
async def gateway_factory(tmp_path: Path) -> AsyncIterator[list[ChildProcess]]:
    children: list[ChildProcess] = []
    yield children
    for child in children:
        child.close()


@pytest.mark.parametrize(
    "backend",
    [
        "emulator",
        pytest.param(
            "sglang",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not _cuda_available(), reason="needs CUDA and the sglang extra"),
            ],
        ),
    ],
)
async def test_gateway_smoke_stream_non_stream_and_cached_prefix(
    tmp_path: Path, gateway_factory: list[ChildProcess], backend: str
) -> None:
    if backend == "emulator":
        cfg = _emulator_config(tmp_path)
    else:
        cfg = LaunchConfig(
            model_path=GPU_MODEL,
            port=free_port(),
            pool_file=tmp_path / "pools" / "chat.endpoints",
            max_running_requests=16,
            mem_fraction_static=0.5,
            log_file=tmp_path / "sglang.log",
        )
    launcher = SGLangLauncher(cfg)
    await launcher.start()
    try:
        listen, admin = free_port(), free_port()
        conf = tmp_path / "envoy.yaml"
        conf.write_text(_envoy_bootstrap(listen, admin, cfg.port))
        argv = [
            str(ENVOY),
            "-c",
            str(conf),
            "--base-id",
            str(envoy_base_id()),
            "--concurrency",
            "1",
            "-l",
            "warning",
        ]
        gateway_factory.append(ChildProcess(argv, log=tmp_path / "envoy.log"))
        wait_for_port(listen, timeout=30)
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{listen}/v1", api_key="x", max_retries=0)
        model = cfg.served_model_name or cfg.model_path
        system = {
            "role": "system",
            "content": "You are terse. " + " ".join(["Rule: be exact."] * 60),
        }
        first = await client.chat.completions.create(
            model=model,
            messages=[system, {"role": "user", "content": "Say one word."}],  # type: ignore[list-item]
            max_tokens=8,
        )
        assert first.choices[0].message.content
        assert first.usage is not None and first.usage.completion_tokens > 0
        stream = await client.chat.completions.create(
            model=model,
            messages=[system, {"role": "user", "content": "Say two words."}],  # type: ignore[list-item]
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        usage = chunks[-1].usage
        assert usage is not None
        first_cached = (
            first.usage.prompt_tokens_details.cached_tokens or 0
            if first.usage.prompt_tokens_details
            else 0
        )
        second = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        assert (second or 0) > first_cached  # the shared system prompt was cached
        await client.close()
    finally:
        await launcher.aclose()
    assert sys.modules.get("sglang") is None  # the test process itself never imported it
