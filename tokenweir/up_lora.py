"""`tokenweir up`: the LoRA flags of an emulated pool's replicas (``pools.NAME.lora``), as a real
SGLang of that pool gets them (docs/emulator.md, "LoRA adapters")."""

from __future__ import annotations

from policy.model import LlmPool

__all__ = ["lora_args"]


def lora_args(pool: LlmPool) -> list[str]:
    """``--enable-lora``, every adapter in ``--lora-paths`` (``name=path``: ``lora.paths``, else
    the name) and ``--max-loras-per-batch`` = ``lora.slots``; none for a pool without adapters."""
    lora = pool.lora
    if lora is None:
        return []
    paths = [f"{name}={lora.paths.get(name, name)}" for name in lora.adapters]
    return ["--enable-lora", "--lora-paths", *paths, "--max-loras-per-batch", str(lora.slots)]
