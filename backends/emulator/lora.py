"""LoRA adapters in the emulator, as SGLang serves them (``python/sglang/srt/lora/``).

Two levels, as in SGLang:

- the **registry** (SGLang's ``LoRARegistry``, in its tokenizer manager): the adapters a request
  may name: ``--lora-paths`` at start, ``/load_lora_adapter`` / ``/unload_lora_adapter`` later.
  It is kept in LRU order (a request's lookup counts as a use); with ``--max-loaded-loras`` a
  load past the limit evicts the least recently used adapter that is not pinned.
  Loading takes ``register_s`` (reading the adapter from disk).
- the **slots** (SGLang's ``LoRAMemoryPool``): ``--max-loras-per-batch`` GPU buffers. A running
  batch holds at most that many distinct adapters; a waiting request whose adapter would exceed
  it is skipped this step (SGLang's ``can_run_lora_batch``). An adapter not in a slot is brought
  in when its request is admitted, evicting the least recently used adapter the batch does not
  use; each such load costs ``load_s`` of that step and counts in ``loads_total``.

A request names its adapter as SGLang accepts it: ``lora_path`` in the body (native
``/generate`` and, as SGLang's extension, the OpenAI endpoints), or the OpenAI ``model`` written
``base:adapter``. An unknown name gets SGLang's message with HTTP 400. The HTTP endpoints are
in :mod:`.lora_api`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from backends.emulator.lora_config import LoraConfig
from backends.errors import RequestError
from prefixindex.adapters import adapter_id

__all__ = ["NOT_ENABLED", "LoraRef", "LoraRegistry", "LoraSlots", "adapter_of"]

NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


@dataclass(frozen=True, slots=True)
class LoraRef:
    """One registered adapter (SGLang's ``LoRARef``)."""

    name: str
    path: str
    pinned: bool = False

    @property
    def lora_id(self) -> int:
        return adapter_id(self.name)


def _keys(names: Iterable[str]) -> str:
    """SGLang prints ``self._registry.keys()`` of an OrderedDict into its messages."""
    return f"odict_keys({list(names)!r})"


class LoraRegistry:
    """The adapters requests may name, in LRU order (requests already admitted keep theirs)."""

    def __init__(self, config: LoraConfig) -> None:
        self.config = config
        self._refs: OrderedDict[str, LoraRef] = OrderedDict()
        self.evictions_total = 0
        for name, path in config.paths:
            self._refs[name] = LoraRef(name, path, name in config.pinned)

    def names(self) -> list[str]:
        return list(self._refs)

    def loaded(self) -> dict[str, str]:
        """SGLang's ``loaded_adapters``: name → path."""
        return {r.name: r.path for r in self._refs.values()}

    def acquire(self, name: str) -> LoraRef:
        """A request names ``name``: its ref (a use, in LRU order); 400 when not loaded."""
        ref = self._refs.get(name)
        if ref is None:
            # SGLang's LoRARegistry.acquire message
            raise RequestError(
                f"The following requested LoRA adapters are not loaded: {name}\n"
                f"Loaded adapters: {_keys(self._refs)}.",
                "lora_path",
            )
        self._refs.move_to_end(name)
        return ref

    def load(self, name: str, path: str, pinned: bool = False) -> None:
        """Register an adapter (ValueError with SGLang's message when it cannot)."""
        if name in self._refs:
            raise ValueError(f"LoRA with name {name} already exists. Loaded LoRAs: "
                             f"{_keys(self._refs)}")  # fmt: skip
        limit = self.config.max_loaded_loras
        if limit is not None and len(self._refs) >= limit:
            victim = next((n for n, r in self._refs.items() if not r.pinned), None)
            if victim is None:
                raise ValueError(
                    f"Failed to load LoRA adapter {name}: the maximum number of loaded LoRA "
                    f"adapters ({limit}) is reached and none can be evicted (all are pinned)."
                )
            del self._refs[victim]
            self.evictions_total += 1
        self._refs[name] = LoraRef(name, path, pinned)

    def unload(self, name: str) -> None:
        if name not in self._refs:
            raise ValueError(
                f"LoRA with name {name} does not exist. Loaded LoRAs: {_keys(self._refs)}"
            )
        del self._refs[name]


class LoraSlots:
    """``--max-loras-per-batch`` GPU slots, LRU; the scheduler asks before each admission."""

    def __init__(self, capacity: int, load_s: float) -> None:
        self.capacity = capacity
        self.load_s = load_s
        self._resident: OrderedDict[str, None] = OrderedDict()
        self.loads_total = 0

    def resident(self) -> list[str]:
        return list(self._resident)

    def fits(self, batch: set[str], name: str | None) -> bool:
        """May a request for ``name`` join a batch that uses the adapters ``batch``?"""
        return name is None or name in batch or len(batch) < self.capacity

    def bring_in(self, name: str, batch: set[str]) -> float:
        """Make ``name`` resident (the batch's adapters stay): the seconds its load costs."""
        if name in self._resident:
            self._resident.move_to_end(name)
            return 0.0
        if len(self._resident) >= self.capacity:
            victim = next(n for n in self._resident if n not in batch)  # fits() guarantees one
            del self._resident[victim]
        self._resident[name] = None
        self.loads_total += 1
        return self.load_s

    def drop(self, name: str) -> None:
        self._resident.pop(name, None)


def adapter_of(body: Mapping[str, object], *, openai: bool) -> str | None:
    """The adapter a request names, as SGLang reads it (None: the base model)."""
    lora = body.get("lora_path")
    if lora is not None and not isinstance(lora, str):
        raise RequestError("lora_path must be a string (the adapter's name)", "lora_path")
    if openai and lora is None:
        model = body.get("model")
        if isinstance(model, str) and ":" in model:
            lora = model.split(":", 1)[1]  # SGLang's "base:adapter"
    return lora or None
