"""Which endpoints a batch may call: embeddings only where a gateway route sends them to a pool."""

from __future__ import annotations

from pathlib import Path

from batch_service.api import served_endpoints
from policy.loader import load_policy_text

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_serves_embeddings_through_its_catch_all_route() -> None:
    policy = load_policy_text((ROOT / "examples" / "mesh.yaml").read_text())
    assert served_endpoints(policy) == (
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
    )  # fmt: skip


def test_no_route_to_a_pool_for_embeddings_refuses_them() -> None:
    text = (ROOT / "examples" / "mesh.yaml").read_text()
    narrowed = text.replace("{prefix: /v1/}", "{prefix: /v1/c}").replace(
        "{prefix: /v1/,", "{prefix: /v1/c,"
    )
    assert narrowed != text
    policy = load_policy_text(narrowed)
    assert served_endpoints(policy) == ("/v1/chat/completions", "/v1/completions")
