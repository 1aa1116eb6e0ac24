"""The overload benchmark's run settings (``bench/overload.py``): the default run, sized for a
2-core machine (``--scale`` multiplies slots and durations), and the seconds-long ``--smoke``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["Config", "config"]


@dataclass(frozen=True)
class Config:
    levels: tuple[float, ...]
    duration: float
    warmup: float
    replicas: int
    running: int
    time_scale: float
    length_scale: int
    interactive_share: float
    patience: dict[str, float]
    max_attempts: int
    storm_arms: tuple[str, ...]
    storm: tuple[float, float, float, float, float]  # base, spike, before, during, after
    storm_patience: float
    storm_max_attempts: int
    arms: tuple[str, ...]
    seed: int
    sample_every: float
    calibration: tuple[float, float]  # seconds measured, seconds of warm-up
    # the longest wait of an honouring client between two attempts (None: as long as told or
    # backed off); the smoke's phases last seconds, its 4-slot pool's promises 10 s and more
    retry_wait: float | None = None


def config(a: argparse.Namespace) -> Config:
    if a.smoke:
        return Config(
            levels=(0.25, 1.0, 3.0), duration=1.5, warmup=0.3, replicas=1, running=4,
            time_scale=1.0, length_scale=32, interactive_share=0.3,
            patience={"interactive": 2.0, "batch": 2.0}, max_attempts=3,
            storm_arms=("envoy", "tokenweir"), storm=(0.5, 3.0, 0.5, 1.0, 1.0),
            storm_patience=1.0, storm_max_attempts=5, arms=tuple(a.arms), seed=a.seed,
            sample_every=0.5, calibration=(2.0, 0.5), retry_wait=1.0,
        )  # fmt: skip
    k = a.scale
    return Config(
        levels=tuple(a.levels), duration=a.duration or 12.0 * k, warmup=3.0, replicas=a.replicas,
        running=a.running * int(k) if k >= 1 else a.running, time_scale=a.time_scale,
        length_scale=a.length_scale, interactive_share=0.3,
        patience={"interactive": 10.0, "batch": 30.0}, max_attempts=4,
        storm_arms=tuple(a.storm_arms), storm=(0.5, 3.0, 5.0, 5.0 * k, 15.0),
        storm_patience=5.0, storm_max_attempts=50, arms=tuple(a.arms), seed=a.seed,
        sample_every=0.25, calibration=(12.0 * k, 3.0),
    )  # fmt: skip
