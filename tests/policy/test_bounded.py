"""Hostile YAML is refused before objects are built: size, depth, aliases, tags."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy import PolicyError, bounded, load_policy, load_policy_text
from policy.bounded import DEFAULT_LIMITS, Limits, compose_bounded


def _problems(text: str, limits: Limits = DEFAULT_LIMITS) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy_text(text, "p.yaml", limits=limits)
    return [str(i) for i in info.value.issues]


@pytest.mark.parametrize("opener,closer", [("[", "]"), ("{a: ", "}")])
def test_thousands_of_levels_are_refused_without_recursion(opener: str, closer: str) -> None:
    text = "version: 1\nplanner:\n  x: " + opener * 5000 + "1" + closer * 5000 + "\n"
    (problem,) = _problems(text)
    assert problem.startswith("p.yaml:3: planner.x")
    assert problem.endswith("nesting deeper than 64 levels; at most 64 are allowed")


def test_block_style_nesting_is_bounded_too() -> None:
    lines = ["version: 1", "planner:"] + [" " * (i + 1) + "k:" for i in range(100)]
    (problem,) = _problems("\n".join(lines) + " 1\n")
    assert "nesting deeper than 64 levels" in problem


def test_alias_bomb_is_refused_before_it_expands() -> None:
    rows = ["version: 1", "planner:", '  l0: &l0 ["x","x","x","x","x","x","x","x","x","x"]']
    rows += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 30)]
    (problem,) = _problems("\n".join(rows) + "\n")
    # 10^30 nodes if expanded; refused at the level where the budget (100k + 10/written) runs out
    assert problem.startswith("p.yaml:7: planner.l4[7]: aliases expand to more than ")
    assert "a YAML alias bomb?" in problem


def test_a_few_shared_anchors_are_fine() -> None:
    tenants = "\n".join(f"  t{i}: {{tier: std, quotas: *q}}" for i in range(200))
    text = (
        "version: 1\ntiers:\n  std: {max_tokens: 100}\n"
        "planner: {q: &q {tokens: {burst: 10, refill_per_second: 1}}}\n"
        f"tenants:\n{tenants}\n"
    )
    policy = load_policy_text(text)
    assert policy.tenants["t199"].quotas is not None
    assert policy.tenants["t199"].quotas.tokens is not None


def test_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("version: 1\n" + "# padding\n" * 100)
    with pytest.raises(PolicyError) as info:
        load_policy(path, Limits(max_bytes=500))
    assert str(info.value) == (
        f"{path}: <root>: the file is larger than 500 bytes; at most 500 allowed"
    )


def test_oversized_text_is_refused() -> None:
    (problem,) = _problems("version: 1\n" + "#" * 1000 + "\n", Limits(max_bytes=100))
    assert "the file is 1012 bytes; at most 100 allowed" in problem


def test_pure_python_parser_gives_the_same_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "_Parser", None)
    text = "version: 1\nplanner:\n  x: " + "[" * 500 + "]" * 500 + "\n"
    (problem,) = _problems(text)
    assert "nesting deeper than 64 levels" in problem
    assert load_policy_text("version: 1\ntiers: {a: {max_tokens: 3}}\n").tiers["a"].max_tokens == 3


def test_composed_nodes_keep_lines_tags_and_shared_anchors() -> None:
    root = compose_bounded("a: &x [1, 2.5, yes, ~, '3']\nb: *x\n", "f")
    assert root is not None
    (ka, va), (kb, vb) = root.value
    assert (ka.start_mark.line, kb.start_mark.line) == (0, 1)
    assert vb is va  # an alias is the same node, not a copy
    tags = [n.tag.rsplit(":", 1)[1] for n in va.value]
    assert tags == ["int", "float", "bool", "null", "str"]


def test_empty_document_is_reported() -> None:
    assert compose_bounded("# nothing\n", "f") is None
    (problem,) = _problems("# nothing\n")
    assert "the policy is empty" in problem
