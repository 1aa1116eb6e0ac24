"""The loader: every bad-policy fixture gets its precise file:line: key: message."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest

from policy import Address, PolicyError, load_policy, load_policy_text

ROOT = Path(__file__).resolve().parents[2]
BAD = Path(__file__).parent / "bad"
FIXTURES = sorted(BAD.glob("*.yaml"))


def _expectation(path: Path) -> tuple[int, str, str]:
    first = path.read_bytes().split(b"\n")[0].decode()
    m = re.match(r"# expect: (\d+): (\S+): (.*)$", first)
    assert m, f"{path.name}: first line must be '# expect: LINE: key.path: message'"
    return int(m.group(1)), m.group(2), m.group(3)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_bad_policy_reports_file_line_key_and_message(fixture: Path) -> None:
    line, key, message = _expectation(fixture)
    with pytest.raises(PolicyError) as info:
        load_policy(fixture)
    rendered = [str(i) for i in info.value.issues]
    wanted = f"{fixture}:{line}: {key}: {message}"
    assert any(r.startswith(wanted) for r in rendered), f"wanted {wanted!r}\ngot {rendered}"


def test_there_are_many_bad_fixtures() -> None:
    assert len(FIXTURES) >= 12


def test_example_policy_loads_and_resolves_emulated_endpoints() -> None:
    policy = load_policy(ROOT / "examples" / "mesh.yaml")
    chat = policy.pools["chat"]
    assert chat.endpoints == tuple(Address("127.0.0.1", p) for p in (30001, 30002, 30003))
    assert chat.affinity.headers == ("x-session-id", "x-prefix-hash")
    assert (
        chat.circuit_breakers.interactive.max_pending_requests
        > chat.circuit_breakers.batch.max_pending_requests
    )
    assert chat.timeouts.request == 0.0 and chat.timeouts.stream_idle == 60.0
    assert policy.tenants["demo-free"].tier == "free"


def test_all_problems_of_a_file_are_reported_at_once() -> None:
    text = "version: 1\npools:\n  a: {models: [m], bogus: 1}\n  b: {models: [m], timeouts: {connect: x}}\n"
    with pytest.raises(PolicyError) as info:
        load_policy_text(text, "m.yaml")
    assert [(i.line, i.path) for i in info.value.issues] == [
        (3, "pools.a.bogus"),
        (4, "pools.b.timeouts.connect"),
    ]


def test_durations_and_sizes_are_parsed() -> None:
    text = (
        "version: 1\npools:\n  a:\n    models: [m]\n    max_body_bytes: 2MiB\n"
        "    timeouts: {connect: 250ms, stream_idle: 2m, request: 0}\n"
    )
    pool = load_policy_text(text).pools["a"]
    assert pool.timeouts.connect == pytest.approx(0.25)
    assert pool.timeouts.stream_idle == 120.0
    assert pool.max_body_bytes == 2 * 1024 * 1024


def test_endpoints_file_is_read_relative_to_the_policy(tmp_path: Path) -> None:
    (tmp_path / "pools").mkdir()
    (tmp_path / "pools" / "chat.endpoints").write_text(
        "# replicas\n127.0.0.1:9001\n\n127.0.0.1:9002  # second\n"
    )
    (tmp_path / "mesh.yaml").write_text(
        "version: 1\npools:\n  chat:\n    models: [m]\n    endpoints: [127.0.0.1:9000]\n"
        "    endpoints_file: pools/chat.endpoints\n"
    )
    pool = load_policy(tmp_path / "mesh.yaml").pools["chat"]
    assert [e.port for e in pool.endpoints] == [9000, 9001, 9002]


def test_bad_line_in_endpoints_file_names_that_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "eps").write_text("127.0.0.1:9001\nnot-an-endpoint\n")
    (tmp_path / "mesh.yaml").write_text(
        "version: 1\npools:\n  chat:\n    models: [m]\n    endpoints_file: eps\n"
    )
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "mesh.yaml")
    (issue,) = info.value.issues
    assert issue.file == str((tmp_path / "eps").resolve()) and issue.line == 2
    assert "expected host:port" in issue.message


def test_missing_endpoints_file_means_no_endpoints_yet(tmp_path: Path) -> None:
    (tmp_path / "mesh.yaml").write_text(
        "version: 1\npools:\n  chat:\n    models: [m]\n    endpoints_file: later\n"
    )
    assert load_policy(tmp_path / "mesh.yaml").pools["chat"].endpoints == ()


def test_plugin_shorthand_and_settings() -> None:
    text = (
        "version: 1\nfilters: {}\npools:\n  chat: {models: [m]}\ngateways:\n  edge:\n    routes:\n"
        "      - name: r\n        pool: chat\n        filters:\n          plugins: [identity, {name: my.mod:Plugin, settings: {k: [1, 2]}}]\n"
    )
    route = load_policy_text(text).gateways["edge"].routes[0]
    assert route.filters is not None
    assert [p.name for p in route.filters.plugins] == ["identity", "my.mod:Plugin"]
    assert route.filters.plugins[1].settings == {"k": [1, 2]}


def test_unreadable_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_load_restores_the_garbage_collectors_state() -> None:
    """The collector is paused while a policy is built (speed), then left as the caller had it
    (the policy watcher pauses it itself around a whole build)."""
    text = "version: 1\n"
    assert gc.isenabled()
    load_policy_text(text)
    assert gc.isenabled()
    gc.disable()
    try:
        load_policy_text(text)
        assert not gc.isenabled()
    finally:
        gc.enable()
