"""What validates never breaks a service: every bad fixture is refused by ``tokenweir validate``,
by each service's builder, and by the running control plane (with the services' check)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controlplane.reloader import Reloader
from controlplane.xds.cache import SnapshotCache
from filters.app import FilterApp, Settings
from filters.errors import ConfigError
from policy import PolicyError, load_policy
from ratelimit_service.server import Service, ServiceSettings
from tokenweir.check import check_file, service_issues
from tokenweir.cli import main

ROOT = Path(__file__).resolve().parents[2]
POLICY_DIR = Path(__file__).parents[1] / "policy"
LOADER_BAD = sorted((POLICY_DIR / "bad").glob("*.yaml"))
SERVICE_BAD = sorted((POLICY_DIR / "bad_services").glob("*.yaml"))
ALL_BAD = LOADER_BAD + SERVICE_BAD


def _expected(path: Path) -> str:
    first = path.read_bytes().split(b"\n")[0].decode()  # the rest may not be UTF-8
    m = re.match(r"# expect: (\d+): (\S+): (.*)$", first)
    assert m, f"{path.name}: first line must be '# expect: LINE: key.path: message'"
    return f"{path}:{m.group(1)}: {m.group(2)}: {m.group(3)}"


@pytest.mark.parametrize("fixture", ALL_BAD, ids=[f.stem for f in ALL_BAD])
def test_validate_prints_the_problem_and_exits_1(
    fixture: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(fixture)]) == 1
    err = capsys.readouterr().err
    assert any(line.startswith(_expected(fixture)) for line in err.splitlines()), err
    assert "Traceback" not in err


@pytest.mark.parametrize("fixture", ALL_BAD, ids=[f.stem for f in ALL_BAD])
async def test_every_service_builder_refuses_it(fixture: Path) -> None:
    # the filter server (start-up load, reload build) and the rate-limit service (reload build)
    example = load_policy(ROOT / "examples" / "mesh.yaml")
    if fixture in LOADER_BAD:
        with pytest.raises(PolicyError):
            FilterApp(Settings(fixture), clock=time.monotonic)
        with pytest.raises(PolicyError):
            Service(ServiceSettings(fixture), example)._build(fixture)
    else:
        app = FilterApp(Settings(fixture), clock=time.monotonic)
        with pytest.raises(ConfigError):
            app._build(fixture)
    # the control plane, given the services' check, refuses it and keeps nothing half-built
    cache = SnapshotCache()
    result = Reloader(fixture, cache, registry=CollectorRegistry(), check=service_issues).reload()
    assert not result.ok and cache.groups() == {}
    assert any(p.startswith(_expected(fixture)) for p in result.problems), result.problems


@pytest.mark.parametrize("fixture", SERVICE_BAD, ids=[f.stem for f in SERVICE_BAD])
def test_service_fixtures_pass_the_loader_alone(fixture: Path) -> None:
    """These are the files that validated before (exit 0) and broke the filter server."""
    load_policy(fixture)
    policy, issues = check_file(fixture)
    assert policy is not None and [str(i) for i in issues] == [_expected(fixture)]


def test_the_example_policy_builds_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "examples" / "mesh.yaml")]) == 0
    assert "OK" in capsys.readouterr().out
    assert service_issues(load_policy(ROOT / "examples" / "mesh.yaml"), ROOT) == []


def test_validate_refuses_an_emulator_profile_the_emulator_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to say OK; `tokenweir up` then failed with the emulator's argparse error."""
    text = (ROOT / "examples" / "mesh.yaml").read_text()
    lines = text.splitlines()
    at = next(i for i, x in enumerate(lines) if "profile: llama-3.1-8b-h100" in x)
    bad = tmp_path / "mesh.yaml"
    bad.write_text(text.replace("profile: llama-3.1-8b-h100", "profile: llama-3.1-8b-h900", 1))
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    want = (
        f"{bad}:{at + 1}: pools.chat.emulated.profile: unknown emulator profile 'llama-3.1-8b-h900'"
    )
    assert want in err, err
    assert "llama-3.1-8b-h100" in err  # the known names are listed
