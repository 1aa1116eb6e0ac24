"""``pools.NAME.priority_scheduling`` reaches a real SGLang (the launcher) and the emulator as
the same SGLang flags, and the emulator reads them back into the same settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.emulator.__main__ import parse_args as emulator_args
from backends.emulator.priority import PriorityConfig
from backends.sglang.__main__ import parse_args as launcher_args
from backends.sglang.launcher import build_command
from policy.scheduling import PriorityScheduling

POLICIES = [
    PriorityScheduling(),
    PriorityScheduling(enabled=True),
    PriorityScheduling(enabled=True, preemption_threshold=0, low_values_first=True),
]


@pytest.mark.parametrize("policy", POLICIES, ids=["off", "on", "on-0-low-first"])
def test_the_launcher_and_the_emulator_get_the_same_flags(
    policy: PriorityScheduling, tmp_path: Path
) -> None:
    flags = policy.server_flags()
    base = ["--model-path", "m", "--port", "30000", "--pool-file", str(tmp_path / "p")]
    cfg = launcher_args([*base, *flags])
    argv = build_command(cfg)
    assert [a for a in argv if "priority" in a] == [f for f in flags if f.startswith("--")]
    assert argv[len(argv) - len(flags) :] == flags  # in this order, with their values

    settings = emulator_args(flags)
    assert settings.priority == PriorityConfig(
        enabled=policy.enabled,
        low_values_first=policy.low_values_first,
        preemption_threshold=policy.preemption_threshold,
    )


def test_off_emits_nothing_so_servers_keep_sglangs_default() -> None:
    assert PriorityScheduling().server_flags() == []
    assert emulator_args([]).priority == PriorityConfig()
