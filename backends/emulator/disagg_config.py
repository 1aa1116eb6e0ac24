"""The ``--disaggregation-*`` settings of one emulator process (kept apart from
:mod:`.disagg`, which drives the server, so that the settings import no server code)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_BOOTSTRAP_PORT", "DEFAULT_KV_BYTES_PER_TOKEN", "MODES", "DisaggConfig"]

MODES = ("null", "prefill", "decode")
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port
# Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes
DEFAULT_KV_BYTES_PER_TOKEN = 131072


@dataclass(frozen=True, slots=True)
class DisaggConfig:
    """``--disaggregation-*`` flags of one emulator process."""

    mode: str = "null"  # null | prefill | decode (SGLang's values)
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT  # prefill: where its bootstrap server listens
    link_gb_per_s: float = 25.0  # KV link bandwidth, GB/s (the emulator's own flag)
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN
    timeout_s: float = 30.0  # how long one side waits for the other (real seconds)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"disaggregation mode must be one of {', '.join(MODES)}")
        if not 0 <= self.bootstrap_port <= 65535:
            raise ValueError(f"bootstrap port out of range: {self.bootstrap_port}")
        if not self.link_gb_per_s > 0 or self.kv_bytes_per_token < 1 or not self.timeout_s > 0:
            raise ValueError("link bandwidth, KV bytes per token and timeout must be > 0")

    @property
    def enabled(self) -> bool:
        return self.mode != "null"
