from __future__ import annotations

import random

import pytest

from backends.emulator.__main__ import parse_args
from backends.emulator.faults import FaultConfig, decide, update_faults
from backends.emulator.settings import EmulatorSettings
from backends.errors import RequestError, UnknownProfileError


def test_update_faults_applies_known_keys() -> None:
    f = update_faults(FaultConfig(), {"error_rate": 0.5, "slow": 3, "slow_start_s": 2}, now=10.0)
    assert (f.error_rate, f.slow, f.unavailable_until) == (0.5, 3.0, 12.0)
    assert f.to_json(now=11.0)["slow_start_s"] == 1.0
    assert update_faults(f, {"error_rate": 0}, now=0).slow == 3.0  # others kept


@pytest.mark.parametrize(
    "payload",
    [
        {"error_rate": 1.5},
        {"error_rate": True},
        {"hang": "yes"},
        {"slow": 0.5},
        {"slow_start_s": -1},
        {"explode": 1},
        [1, 2],
    ],
)
def test_update_faults_rejects_bad_values(payload: object) -> None:
    with pytest.raises(RequestError):
        update_faults(FaultConfig(), payload, now=0.0)


def test_decide_follows_rates() -> None:
    rng = random.Random(3)
    n = 4000
    errors = sum(decide(FaultConfig(error_rate=0.25), rng) == "error" for _ in range(n))
    assert 0.2 * n < errors < 0.3 * n
    assert decide(FaultConfig(hang=True), rng) == "hang"
    assert all(decide(FaultConfig(), rng) == "ok" for _ in range(100))
    assert all(decide(FaultConfig(hang_rate=1.0), rng) == "hang" for _ in range(100))


def test_settings_validate_and_apply_overrides() -> None:
    s = EmulatorSettings(profile="seed-2k", cache_tokens=1234, max_running_requests=7)
    p = s.resolved_profile()
    assert (p.max_total_tokens, p.max_running_requests) == (1234, 7)
    with pytest.raises(UnknownProfileError):
        EmulatorSettings(profile="nope")
    with pytest.raises(ValueError):
        EmulatorSettings(time_scale=0)
    with pytest.raises(ValueError):
        EmulatorSettings(error_rate=2)


def test_cli_parses_into_settings() -> None:
    s = parse_args(
        [
            "--port", "1234", "--model", "x", "--profile", "seed-2k", "--time-scale", "0.1",
            "--seed", "5", "--max-running-requests", "3", "--max-queued-requests", "4",
            "--cache-tokens", "999", "--page-size", "2", "--error-rate", "0.1",
            "--hang-rate", "0.2", "--slow-start", "1.5",
        ]
    )  # fmt: skip
    assert s.port == 1234 and s.model == "x" and s.time_scale == 0.1 and s.seed == 5
    p = s.resolved_profile()
    assert (p.max_running_requests, p.max_queued_requests, p.max_total_tokens, p.page_size) == (
        3, 4, 999, 2,
    )  # fmt: skip
    assert (s.error_rate, s.hang_rate, s.slow_start_s, s.exit_on_crash) == (0.1, 0.2, 1.5, True)
    with pytest.raises(SystemExit):
        parse_args(["--error-rate", "3"])
