"""How a client names an adapter of a LoRA pool (``pools.NAME.lora``): by its name as the
``model``, or as SGLang's OpenAI server reads it, ``base:adapter``."""

from __future__ import annotations

from policy.model import LlmPool

__all__ = ["adapter_model"]


def adapter_model(pool: LlmPool | None, model: str) -> str:
    """The model a request names: ``base:adapter`` on a LoRA pool whose base model is ``base``
    becomes ``adapter`` (served, quoted and priced under that name); anything else unchanged."""
    lora = pool.lora if pool is not None else None
    if pool is None or lora is None or ":" not in model:
        return model
    base, _, adapter = model.partition(":")
    return adapter if base in pool.models and base not in lora.adapters else model
