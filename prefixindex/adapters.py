"""A LoRA adapter's id and the seed its prefix hashes chain from.

A backend caches prefixes per adapter (SGLang keys its radix cache by the request's ``lora_id``):
the same tokens under two adapters are two different KV blocks. So the block hashes of an
adapter's prefix chain from a seed derived from its name, and the base model's from nothing;
the emulator's KV events and the gateway's prefix lookup use these same two functions.
"""

from __future__ import annotations

import hashlib

__all__ = ["adapter_id", "adapter_prior"]


def adapter_id(name: str) -> int:
    """The adapter's 63-bit id (``BlockStored.lora_id``), derived from its name alone.

    SGLang mints ``uuid5(name, path)`` for ``--lora-paths`` adapters; a name-only id lets a
    gateway that knows just the name compute it too.
    """
    digest = hashlib.blake2b(name.encode(), digest_size=8, person=b"tw-lora").digest()
    return int.from_bytes(digest, "big") >> 1


def adapter_prior(lora_id: int | None) -> bytes | None:
    """The ``prior`` of ``hashing.chain_digests`` for the first page under this adapter."""
    return None if lora_id is None else b"lora" + lora_id.to_bytes(8, "big")
