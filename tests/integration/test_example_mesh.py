"""The harness's variants of examples/mesh.yaml: each is a policy `tokenweir validate` accepts,
every fixed port moved, the parts asked for left out and nothing else; an example that no longer
has what an edit expects fails the helper with the edit named."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy.loader import load_policy_text
from tests.integration import example_mesh
from tests.integration.example_mesh import example_policy
from tests.integration.up_process import ROOT
from tokenweir.check import service_issues


def test_the_full_example_keeps_every_part() -> None:
    text, gw = example_policy()
    p = load_policy_text(text)
    assert p.pools["chat"].emulated is not None and p.pools["chat"].emulated.replicas == 3
    assert set(p.pools) == {"chat", "chat-small"} and p.pools["chat"].fallback == "chat-small"
    assert set(p.services) == {"batch-api", "inventory"} and set(p.sidecars) == {
        "inventory-sidecar"
    }
    assert p.batch is not None and str(p.gateways["edge"].listen) == f"127.0.0.1:{gw}"
    example = (ROOT / "examples" / "mesh.yaml").read_text()
    # the same text as the example but for its ports and the emulators' speed
    assert len(text.splitlines()) == len(example.splitlines()) + 1  # chat's time_scale line


def test_the_smallest_variant_leaves_out_what_it_was_asked_to() -> None:
    text, gw = example_policy(replicas=1, batch=False, sidecar=False, fallback=False)
    p = load_policy_text(text)
    assert service_issues(p, ROOT) == []
    assert set(p.pools) == {"chat"} and p.pools["chat"].fallback is None
    assert p.pools["chat"].emulated is not None and p.pools["chat"].emulated.replicas == 1
    assert p.pools["chat"].degradation is not None
    assert [s.action for s in p.pools["chat"].degradation.steps] == ["clamp_max_tokens", "shed"]
    assert set(p.services) == {"inventory"} and not p.sidecars and p.batch is None
    routes = [r.name for r in p.gateways["edge"].routes]
    assert routes == ["chat-completions", "generate", "inventory"]
    assert set(p.tenants) == {"demo-free", "demo-pro"}
    assert str(p.gateways["edge"].listen) == f"127.0.0.1:{gw}"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (("replicas: 3\n", "replicas: 2\n"), "replicas: 3"),
        (("  chat-small:", "  chat-tiny:"), "chat-small:"),
        (("sidecars:\n", "side_cars:\n"), "sidecars:"),
        (("      - name: batch-jobs\n", "      - name: batch-j\n"), "batch-jobs"),
    ],
)
def test_a_changed_example_fails_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: tuple[str, str], named: str
) -> None:
    text = (ROOT / "examples" / "mesh.yaml").read_text()
    assert change[0] in text
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "mesh.yaml").write_text(text.replace(change[0], change[1], 1))
    monkeypatch.setattr(example_mesh, "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"examples/mesh\.yaml changed") as failed:
        example_policy(replicas=1, batch=False, sidecar=False, fallback=False)
    assert named in str(failed.value)
