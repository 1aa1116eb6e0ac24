"""One generation request inside the emulator's scheduler, and what its HTTP handler reads."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from backends.emulator.radix_cache import CacheNode
from prefixindex.adapters import adapter_id

__all__ = ["EmuRequest", "GenerationParams"]


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What a request asks for, validated by the HTTP layer."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    ignore_eos: bool = False
    stop: frozenset[str] = frozenset()
    priority: int | None = None  # the body's ``priority`` (SGLang: GenerateReqInput.priority)
    lora: str | None = None  # the LoRA adapter it names (lora.py); None: the base model

    @property
    def lora_id(self) -> int | None:
        """The adapter's id: its radix-cache namespace and its KV events' ``lora_id``."""
        return None if self.lora is None else adapter_id(self.lora)


@dataclass(eq=False, slots=True)
class EmuRequest:
    """Mutable state of one request; only the scheduler writes it, the handler reads it."""

    rid: str
    params: GenerationParams
    rng: random.Random
    arrival: float
    # scheduler state
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    cached_tokens: int = 0
    prefilled: int = 0  # prompt tokens computed or matched so far
    node: CacheNode | None = None  # locked cache node of the matched or inserted prompt
    reserved: int = 0  # tokens allocated outside the tree and not yet committed
    held_tail: int = 0  # prompt tokens of a partial last page, held until the finish
    recomputed: int = 0  # output tokens prefilled again after a retraction (part of the fill)
    output_ids: list[int] = field(default_factory=list)
    output_words: list[str] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    matched_stop: str | None = None
    priority: int = 0  # as the scheduler ranks it (``priority.PriorityConfig.resolve``)
    queue_seq: int = 0  # order of the latest entry into the waiting queue
    abort_message: str | None = None  # the scheduler aborted it: SGLang's message (503)
    kv_transferred: bool = False  # PD decode: its prompt's KV came from a prefill server
    # handler side
    event: asyncio.Event = field(default_factory=asyncio.Event)
    read_upto: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.params.prompt_ids)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def fill_ids(self) -> tuple[int, ...]:
        """What prefill computes: the prompt, and after a retraction the output so far."""
        if not self.recomputed:
            return self.params.prompt_ids
        return (*self.params.prompt_ids, *self.output_ids[: self.recomputed])

    @property
    def fill_len(self) -> int:
        return len(self.params.prompt_ids) + self.recomputed

    @property
    def max_new_tokens(self) -> int:
        return self.params.max_new_tokens

    @property
    def output_len(self) -> int:
        return len(self.output_ids)

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= self.fill_len

    def take_new_words(self) -> list[str]:
        """Words produced since the last call (and clear the wake-up event)."""
        self.event.clear()
        new = self.output_words[self.read_upto :]
        self.read_upto = len(self.output_words)
        return new

    async def wait(self) -> None:
        """Until new words or the end arrive."""
        if self.read_upto < len(self.output_words) or self.done:
            return
        await self.event.wait()

    async def wait_done(self) -> None:
        while not self.done:
            self.event.clear()
            await self.event.wait()
