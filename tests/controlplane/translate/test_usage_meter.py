"""The Lua usage meter as rendered (golden file), its HTTP filter, per-route switch and access log."""

from __future__ import annotations

import json
import os
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from controlplane.translate.usage_meter import (
    lua_source,
    usage_access_log,
    usage_http_filter,
)

GOLDEN = Path(__file__).parent / "golden" / "usage_meter.rendered.json"


def test_rendered_meter_matches_golden_file() -> None:
    got = json.dumps(
        {
            "http_filter": MessageToDict(usage_http_filter()),
            "access_log": MessageToDict(usage_access_log()),
        },
        indent=1,
        sort_keys=True,
    )
    if os.environ.get("TOKENWEIR_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), (
        "rendered meter changed; review, rerun with TOKENWEIR_UPDATE_GOLDEN=1"
    )


def test_the_bucket_bounds_are_filled_in() -> None:
    src = lua_source()
    assert "__GAP__" not in src
    assert (
        "local GAP = {1000, 2500, 5000, 10000, 20000, 50000, 100000, 250000, 500000, 1000000, 5000000}"
        in src
    )
