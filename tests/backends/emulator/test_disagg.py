"""PD disaggregation's pure parts: the bootstrap fields, the link model, the flags."""

from __future__ import annotations

import pytest

from backends.emulator.__main__ import parse_args
from backends.emulator.disagg import (
    DEFAULT_BOOTSTRAP_PORT,
    Bootstrap,
    DisaggConfig,
    RoomTable,
    parse_bootstrap,
    transfer_seconds,
)
from backends.errors import RequestError


def test_bootstrap_fields_as_sglang_router_sends_them() -> None:
    body = {"bootstrap_host": "10.0.0.5", "bootstrap_port": 9001, "bootstrap_room": 2**63 - 1}
    assert parse_bootstrap(body) == Bootstrap("10.0.0.5", 9001, 2**63 - 1)
    assert parse_bootstrap({"text": "x"}) is None  # served whole
    # the router sends null when the prefill has no bootstrap port: SGLang's default port
    null_port = parse_bootstrap(
        {"bootstrap_host": "h", "bootstrap_port": None, "bootstrap_room": 1}
    )
    assert null_port == Bootstrap("h", DEFAULT_BOOTSTRAP_PORT, 1)
    assert parse_bootstrap({"bootstrap_host": "[::1]", "bootstrap_room": 3}).host == "::1"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"bootstrap_room": -1, "bootstrap_host": "h"}, "bootstrap_room"),
        ({"bootstrap_room": "7", "bootstrap_host": "h"}, "bootstrap_room"),
        ({"bootstrap_room": True, "bootstrap_host": "h"}, "bootstrap_room"),
        ({"bootstrap_room": 2**64, "bootstrap_host": "h"}, "bootstrap_room"),
        ({"bootstrap_room": 1}, "bootstrap_host"),
        ({"bootstrap_room": 1, "bootstrap_host": "h", "bootstrap_port": 70000}, "bootstrap_port"),
        ({"bootstrap_room": 1, "bootstrap_host": "h", "bootstrap_port": "80"}, "bootstrap_port"),
    ],
)
def test_malformed_bootstrap_fields_are_a_400(body: dict[str, object], param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_bootstrap(body)
    assert err.value.param == param


def test_transfer_time_is_kv_bytes_over_link_bandwidth() -> None:
    cfg = DisaggConfig(mode="decode", link_gb_per_s=10.0, kv_bytes_per_token=100_000)
    assert transfer_seconds(1000, cfg) == pytest.approx(0.01)  # 100 MB at 10 GB/s
    assert transfer_seconds(2000, cfg) == pytest.approx(2 * transfer_seconds(1000, cfg))


@pytest.mark.parametrize(
    "changes",
    [{"mode": "both"}, {"bootstrap_port": 70000}, {"link_gb_per_s": 0}, {"timeout_s": 0}],
)
def test_bad_config_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        DisaggConfig(**changes)  # type: ignore[arg-type]


def test_flags_as_sglang_launch_server_takes_them() -> None:
    s = parse_args(
        ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "9100",
         "--disaggregation-transfer-backend", "mooncake", "--disaggregation-link-gb-per-s", "5"]
    )  # fmt: skip
    assert s.disaggregation == DisaggConfig(mode="prefill", bootstrap_port=9100, link_gb_per_s=5)
    assert not parse_args([]).disaggregation.enabled
    with pytest.raises(SystemExit):
        parse_args(["--disaggregation-mode", "both"])


def test_room_table_keeps_a_room_until_dropped_and_prunes_expired_ones() -> None:
    now = [0.0]
    table = RoomTable(ttl_s=1.0, clock=lambda: now[0])
    first = table.get(7)
    assert table.get(7) is first
    table.drop(7)
    assert table.get(7) is not first
    for room in range(100):
        table.get(room)
    now[0] = 10.0
    table.get(1000)
    assert len(table) == 1  # the stale rooms were pruned
