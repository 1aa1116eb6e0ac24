"""The ``--enable-lora`` / ``--lora-paths`` / ``--max-loras-per-batch`` / ``--max-loaded-loras``
settings of one emulator process.

Kept apart from :mod:`.lora` (the registry and slots the scheduler drives) so that the settings
import no server code, as :mod:`.disagg_config`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

__all__ = ["DEFAULT_MAX_LORAS_PER_BATCH", "LoraConfig", "add_lora_args", "lora_config"]

DEFAULT_MAX_LORAS_PER_BATCH = 8  # SGLang's --max-loras-per-batch default


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """LoRA flags of one emulator process (SGLang's names and defaults)."""

    enabled: bool = False  # --enable-lora (implied by --lora-paths, as SGLang)
    paths: tuple[tuple[str, str], ...] = ()  # --lora-paths: (name, path), in order
    pinned: frozenset[str] = field(default_factory=frozenset)
    max_loras_per_batch: int = DEFAULT_MAX_LORAS_PER_BATCH  # GPU slots (SGLang's memory pool)
    max_loaded_loras: int | None = None  # adapters registered at once (CPU), LRU beyond
    max_lora_rank: int | None = None  # accepted; the emulator has no weights
    load_s: float = 0.02  # emulator: seconds to bring an adapter into a GPU slot
    register_s: float = 0.05  # emulator: seconds /load_lora_adapter takes (disk -> CPU)

    def __post_init__(self) -> None:
        if self.max_loras_per_batch < 1:
            raise ValueError("--max-loras-per-batch must be >= 1")
        if self.max_loaded_loras is not None:
            if self.max_loaded_loras < self.max_loras_per_batch:
                # SGLang's check_lora_server_args: the same rule
                raise ValueError(
                    "--max-loaded-loras must be >= --max-loras-per-batch "
                    f"({self.max_loaded_loras} < {self.max_loras_per_batch})"
                )
            if len(self.paths) > self.max_loaded_loras:
                raise ValueError(
                    f"--lora-paths names {len(self.paths)} adapters, more than "
                    f"--max-loaded-loras {self.max_loaded_loras}"
                )
        if self.load_s < 0 or self.register_s < 0:
            raise ValueError("LoRA load times must be >= 0")
        names = [n for n, _ in self.paths]
        if len(set(names)) != len(names):
            raise ValueError("--lora-paths names an adapter twice")


def _parse_path(spec: str) -> tuple[str, str, bool]:
    """One ``--lora-paths`` item as SGLang accepts it: ``name=path``, ``path`` (the name is the
    path), or a JSON object ``{"lora_name": ..., "lora_path": ..., "pinned": ...}``."""
    spec = spec.strip()
    if spec.startswith("{"):
        try:
            obj = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--lora-paths: {spec!r} is not valid JSON: {exc}") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("lora_name"), str):
            raise ValueError(f"--lora-paths: {spec!r} needs lora_name and lora_path")
        return obj["lora_name"], str(obj.get("lora_path", "")), bool(obj.get("pinned", False))
    name, sep, path = spec.partition("=")
    if not sep:
        return spec, spec, False
    if not name or not path:
        raise ValueError(f"--lora-paths: {spec!r}: expected name=path")
    return name, path, False


def add_lora_args(parser: argparse.ArgumentParser) -> None:
    """SGLang's LoRA flags, and the emulator's load-time model."""
    g = parser.add_argument_group("LoRA adapters (SGLang's flags; docs/emulator.md)")
    g.add_argument("--enable-lora", action="store_true")
    g.add_argument(
        "--lora-paths", nargs="*", default=[], metavar="NAME=PATH",
        help="adapters loaded at start: name=path, path, or a JSON object (SGLang's forms)",
    )  # fmt: skip
    g.add_argument(
        "--max-loras-per-batch", type=int, default=DEFAULT_MAX_LORAS_PER_BATCH,
        help="GPU slots: distinct adapters in one running batch (SGLang's default 8)",
    )  # fmt: skip
    g.add_argument(
        "--max-loaded-loras", type=int,
        help="adapters registered at once; loading another evicts the least recently used",
    )  # fmt: skip
    g.add_argument("--max-lora-rank", type=int, help="accepted (the emulator has no weights)")
    g.add_argument("--lora-target-modules", nargs="*", help="accepted")
    g.add_argument("--lora-backend", help="accepted")
    g.add_argument(
        "--lora-load-ms", type=float, default=20.0,
        help="emulator: ms to bring an adapter into a GPU slot (added to that step)",
    )  # fmt: skip
    g.add_argument(
        "--lora-register-ms", type=float, default=50.0,
        help="emulator: ms that /load_lora_adapter takes (reading the adapter from disk)",
    )  # fmt: skip


def lora_config(a: argparse.Namespace) -> LoraConfig:
    """The parsed flags as a ``LoraConfig`` (ValueError on bad values)."""
    parsed = [_parse_path(spec) for spec in a.lora_paths if spec.strip()]
    return LoraConfig(
        enabled=a.enable_lora or bool(parsed),
        paths=tuple((n, p) for n, p, _ in parsed),
        pinned=frozenset(n for n, _, pin in parsed if pin),
        max_loras_per_batch=a.max_loras_per_batch,
        max_loaded_loras=a.max_loaded_loras,
        max_lora_rank=a.max_lora_rank,
        load_s=a.lora_load_ms / 1000.0,
        register_s=a.lora_register_ms / 1000.0,
    )
