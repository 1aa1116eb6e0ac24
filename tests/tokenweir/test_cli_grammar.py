"""One grammar: every ``tokenweir`` command takes its policy as ``-c FILE`` (``validate`` and
``render`` took only a bare path; it still works)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenweir.cli import main

ROOT = Path(__file__).resolve().parents[2]
GOOD = ROOT / "tests" / "controlplane" / "translate" / "golden" / "mesh.yaml"
BAD = ROOT / "tests" / "policy" / "bad" / "unknown_key.yaml"


@pytest.mark.parametrize("form", [["-c"], ["--config"], []], ids=["-c", "--config", "bare"])
def test_validate_takes_c_and_still_a_bare_path(
    form: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", *form, str(GOOD)]) == 0
    assert f"{GOOD}: OK" in capsys.readouterr().out
    assert main(["validate", *form, str(BAD)]) == 1
    assert "pools.chat.affinty: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize("form", [["-c"], []], ids=["-c", "bare"])
def test_render_takes_c_and_still_a_bare_path(
    form: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["render", *form, str(GOOD), "--node", "edge"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"edge"}


@pytest.mark.parametrize("command", ["validate", "render"])
def test_no_policy_or_two_policies_is_a_usage_error_that_names_c(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([command])
    assert info.value.code == 2
    assert "the policy file is required: -c FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main([command, "-c", str(GOOD), str(BAD)])
    assert info.value.code == 2
    assert (
        f"two policy files given ({GOOD} and {BAD}); give one, with -c" in capsys.readouterr().err
    )
