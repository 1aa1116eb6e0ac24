"""Fault injection: what the emulator does wrong on purpose, and the pure decision per request.

Runtime control: ``POST /_emulator/faults`` with a JSON object holding any of the keys below
(others are rejected with 400); ``GET`` returns the current values.

- ``error_rate`` (0..1): that share of new requests is answered 500 at once.
- ``hang_rate`` (0..1): that share of new requests is accepted and never answered.
- ``hang`` (bool): every new request hangs, and so does ``/health_generate``.
- ``slow`` (>= 1): every scheduler step lasts this many times longer (a degraded GPU).
- ``slow_start_s`` (>= 0): be unavailable (503 on requests, ``/health``) for that long from now,
  as a server loading weights after a restart.
- ``crash`` (true): abort every connection and stop serving (the process exits when run as one).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from backends.errors import RequestError
from wire.jsontypes import JsonObject

__all__ = ["FaultConfig", "FaultDecision", "decide", "update_faults"]

FaultDecision = Literal["ok", "error", "hang"]


@dataclass(frozen=True, slots=True)
class FaultConfig:
    error_rate: float = 0.0
    hang_rate: float = 0.0
    hang: bool = False
    slow: float = 1.0
    unavailable_until: float = 0.0  # clock value until which the server answers 503
    crash: bool = False

    def to_json(self, now: float) -> JsonObject:
        return {
            "error_rate": self.error_rate,
            "hang_rate": self.hang_rate,
            "hang": self.hang,
            "slow": self.slow,
            "slow_start_s": max(self.unavailable_until - now, 0.0),
            "crash": self.crash,
        }


def _rate(payload: Mapping[str, object], key: str, default: float) -> float:
    if key not in payload:
        return default
    value = payload[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise RequestError(f"{key} must be a number within [0, 1], got {value!r}", key)
    return float(value)


def _flag(payload: Mapping[str, object], key: str, default: bool) -> bool:
    if key not in payload:
        return default
    value = payload[key]
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be true or false", key)
    return value


def update_faults(current: FaultConfig, payload: object, now: float) -> FaultConfig:
    """Apply a ``POST /_emulator/faults`` body; RequestError (400) names a bad or unknown key."""
    if not isinstance(payload, dict):
        raise RequestError("the body must be a JSON object")
    allowed = {"error_rate", "hang_rate", "hang", "slow", "slow_start_s", "crash"}
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise RequestError(f"unknown fault keys {unknown}; allowed: {sorted(allowed)}")
    error_rate = _rate(payload, "error_rate", current.error_rate)
    hang_rate = _rate(payload, "hang_rate", current.hang_rate)
    hang = _flag(payload, "hang", current.hang)
    crash = _flag(payload, "crash", current.crash)
    slow = current.slow
    if "slow" in payload:
        value = payload["slow"]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
            raise RequestError(f"slow must be a number >= 1, got {value!r}", "slow")
        slow = float(value)
    until = current.unavailable_until
    if "slow_start_s" in payload:
        s = payload["slow_start_s"]
        if isinstance(s, bool) or not isinstance(s, int | float) or s < 0:
            raise RequestError(f"slow_start_s must be a number >= 0, got {s!r}", "slow_start_s")
        until = now + float(s)
    return FaultConfig(error_rate, hang_rate, hang, slow, until, crash)


def decide(faults: FaultConfig, rng: random.Random) -> FaultDecision:
    """What happens to one new request (one draw each from ``rng`` for the two rates)."""
    if faults.hang:
        return "hang"
    error_draw, hang_draw = rng.random(), rng.random()
    if error_draw < faults.error_rate:
        return "error"
    if hang_draw < faults.hang_rate:
        return "hang"
    return "ok"
