"""The LiteLLM proxy arm's set-up: its own virtual environment, config and custom auth module.

``litellm[proxy]`` is not a dependency of tokenweir: its resolver downgrades a package of our dev
environment (huggingface_hub 2.x -> 1.x) and it pulls ~70 packages (boto3, azure, polars, mcp…).
``ensure_venv`` creates ``.venv-peers/`` at the repository root with the pinned version the first
time the benchmark needs it (``--no-install`` forbids that: the arm is then skipped with a
message). Offline: ``LITELLM_LOCAL_MODEL_COST_MAP=True``.

Per-key TPM limits without Postgres: virtual keys need a database, so a custom auth module
(``peers_litellm_auth.py``, copied next to the config) accepts the benchmark's keys and returns
each with its ``tpm_limit``; LiteLLM's own parallel-request limiter enforces it, with its counters
in Redis (``general_settings.coordination_redis``), as several proxies sharing one Redis would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

__all__ = [
    "LITELLM_ENV",
    "LITELLM_VERSION",
    "VENV",
    "ensure_venv",
    "litellm_command",
    "write_litellm_config",
]

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-peers"
LITELLM_VERSION = "1.108.7"
MASTER_KEY = "sk-tw-peers-master"
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MASTER_KEY": MASTER_KEY,
    "DISABLE_SCHEMA_UPDATE": "True",
    # a model named llama-3* makes LiteLLM fetch a tokenizer from the Hugging Face hub (retried
    # for ~25 s per request offline); offline mode fails at once and LiteLLM falls back to tiktoken
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
AUTH_MODULE = Path(__file__).resolve().parent / "peers_litellm_auth.py"


def litellm_binary(venv: Path = VENV) -> Path:
    return venv / "bin" / "litellm"


def ensure_venv(install: bool, venv: Path = VENV) -> str | None:
    """None when the proxy is ready to run, else why its arm is skipped."""
    if litellm_binary(venv).exists():
        return None
    if not install:
        return f"LiteLLM arm skipped: {litellm_binary(venv)} is missing (run bench/peers.py once without --no-install to create {venv.name}/)"
    py = shutil.which("python3") or "python3"
    try:
        subprocess.run([py, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"],
            check=True,
            capture_output=True,
            timeout=1800,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        return f"LiteLLM arm skipped: installing litellm[proxy] into {venv.name}/ failed: {exc}"
    return None


def write_litellm_config(
    run_dir: Path,
    model: str,
    backend_urls: Sequence[str],
    redis_port: int,
    tpm_limits: Mapping[str, int],
) -> Path:
    """A proxy config: one deployment per emulator under one model name, the custom auth
    module, Redis for the limiter's counters. Returns the config's path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(AUTH_MODULE, run_dir / "peers_litellm_auth.py")
    (run_dir / "tpm_limits.json").write_text(json.dumps(dict(tpm_limits)))
    config = {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": f"{url}/v1",
                    "api_key": "none",
                },
            }
            for url in backend_urls
        ],
        "router_settings": {
            "routing_strategy": "simple-shuffle",
            "redis_host": "127.0.0.1",
            "redis_port": redis_port,
        },
        "litellm_settings": {
            "drop_params": True,
            "request_timeout": 120,
            "set_verbose": False,
            "json_logs": False,
        },
        "general_settings": {
            "master_key": MASTER_KEY,
            "custom_auth": "peers_litellm_auth.user_api_key_auth",
            "disable_spend_logs": True,
            # the limiter's counters in Redis, without response caching (litellm_settings.cache
            # would answer repeated prompts from Redis and the backends would serve nothing)
            "coordination_redis": {"host": "127.0.0.1", "port": redis_port},
        },
    }
    path = run_dir / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def litellm_command(config: Path, port: int, venv: Path = VENV) -> list[str]:
    return [
        str(litellm_binary(venv)), "--config", str(config), "--host", "127.0.0.1",
        "--port", str(port), "--num_workers", "1",
    ]  # fmt: skip
