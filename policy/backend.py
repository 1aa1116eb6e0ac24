"""``pools.NAME.backend``: which inference server a pool's replicas run (docs/production.md).

- ``sglang`` (the default): the gateway reads ``sglang:`` metrics, ``/get_server_info`` for the
  capacity the policy leaves out, and SGLang's KV events (block hashes used as they come).
- ``vllm``: ``vllm:`` metrics, no server-info endpoint (so ``capacity.max_running_requests``,
  vLLM's ``--max-num-seqs``, is required), and vLLM's KV events, whose block hashes the gateway
  recomputes from their token ids (``prefixindex/vllm_wire.py``).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["BACKENDS", "BackendKind", "check_backend_capacity"]

BackendKind = Literal["sglang", "vllm"]
BACKENDS: tuple[str, ...] = ("sglang", "vllm")


def check_backend_capacity(backend: str, max_running_requests: int | None) -> None:
    """vLLM does not report its ``--max-num-seqs``: the policy must (ValueError otherwise)."""
    if backend == "vllm" and max_running_requests is None:
        raise ValueError(
            "capacity.max_running_requests: required with backend: vllm (set it to the "
            "servers' --max-num-seqs; vLLM does not report it)"
        )
