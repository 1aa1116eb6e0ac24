"""The batch section's cross-references, each refused with its file line (issue 41)."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy.errors import PolicyError
from policy.loader import load_policy_text

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "mesh.yaml").read_text()


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as err:
        load_policy_text(text, "mesh.yaml")
    return [f"{i.path}: {i.message}" for i in err.value.issues]


def test_the_example_serves_the_batch_api() -> None:
    p = load_policy_text(EXAMPLE, "mesh.yaml")
    assert p.batch is not None and p.batch.service == "batch-api" and p.batch.runner.replicas == 1


def test_unknown_service_gateway_and_pool() -> None:
    text = EXAMPLE.replace("  service: batch-api  ", "  service: nowhere  ")
    text = text.replace("  pool: chat                    # whose", "  pool: gone  # whose")
    got = problems(text)
    assert any(p.startswith("batch.service: unknown service 'nowhere'") for p in got), got
    assert any(p.startswith("batch.pool: unknown pool 'gone'") for p in got), got


def test_a_route_to_the_api_without_identity_is_refused() -> None:
    text = EXAMPLE.replace(
        "plugins: [{name: identity, settings: {forward_authorization: true}}]",
        "plugins: [identity]",
        1,
    )
    got = problems(text)
    assert any(
        p.startswith("gateways.edge.routes[0].filters: a route to the batch API needs") for p in got
    ), got


def test_the_lines_need_a_route_with_idempotency() -> None:
    text = EXAMPLE.replace("plugins: [identity, idempotency, lane,", "plugins: [identity, lane,")
    got = problems(text)
    assert any(p.startswith("batch.gateway: no route of gateway 'edge'") for p in got), got


def test_unknown_keys_and_ranges_name_the_line() -> None:
    text = EXAMPLE.replace("fill: 0.95, backoff: 1s}", "fill: 2, backoff: 1s, speed: 3}")
    with pytest.raises(PolicyError) as err:
        load_policy_text(text, "mesh.yaml")
    msg = str(err.value)
    assert "batch.runner.fill" in msg and "batch.runner.speed" in msg
    assert "mesh.yaml:" in msg


def test_the_batch_price_factor_is_a_discount_named_by_line() -> None:
    text = EXAMPLE.replace("  price_factor: 0.5 ", "  price_factor: 1.5 ")
    assert text != EXAMPLE
    with pytest.raises(PolicyError) as err:
        load_policy_text(text, "mesh.yaml")
    msg = str(err.value)
    line = 1 + EXAMPLE[: EXAMPLE.index("  price_factor: 0.5")].count("\n")
    assert f"mesh.yaml:{line}" in msg and "batch.price_factor" in msg and "<= 1" in msg, msg
    assert load_policy_text(EXAMPLE, "mesh.yaml").batch.price_factor == 0.5  # type: ignore[union-attr]
