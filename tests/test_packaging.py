"""The package installs its console scripts and never shadows the `envoy` protos."""

from __future__ import annotations

import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_init_in_top_level_envoy_folder() -> None:
    assert not (ROOT / "envoy" / "__init__.py").exists()


def test_envoy_protos_import_from_xds_protos() -> None:
    mod = importlib.import_module("envoy.config.cluster.v3.cluster_pb2")
    assert "site-packages" in str(mod.__file__)
