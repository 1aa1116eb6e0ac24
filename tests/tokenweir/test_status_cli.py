"""``tokenweir status`` without a running mesh: says so and how to start one (was a bare
``Connection refused``)."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest

from tokenweir import status_cli
from tokenweir.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _refused(url: str) -> object:
    raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))


def test_status_without_a_mesh_says_none_runs_and_how_to_start_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(status_cli, "_get", _refused)
    policy = ROOT / "examples" / "mesh.yaml"
    assert main(["status", "-c", str(policy)]) == 1
    assert capsys.readouterr().err == (
        "tokenweir status: no mesh is running: nothing listens on http://127.0.0.1:18001 "
        f"(control_plane.metrics of {policy}); start one with `tokenweir up -c {policy}`\n"
    )


def test_status_names_the_flag_it_was_given_and_other_errors_stay_as_they_are(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(status_cli, "_get", _refused)
    assert main(["status", "--control-plane", "127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "no mesh is running: nothing listens on http://127.0.0.1:9 (--control-plane)" in err
    assert "`tokenweir up -c mesh.yaml`" in err

    def timeout(url: str) -> object:
        raise urllib.error.URLError(TimeoutError("timed out"))

    monkeypatch.setattr(status_cli, "_get", timeout)
    assert main(["status", "--control-plane", "127.0.0.1:9"]) == 1
    assert (
        capsys.readouterr().err == "tokenweir status: cannot read http://127.0.0.1:9: timed out\n"
    )
