"""``runtime.children.checkout``: a child started with it imports the other checkout's code."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from runtime.children import Child, checkout


def test_no_checkout_changes_nothing() -> None:
    assert checkout(None) == ({}, None)


async def test_a_child_imports_the_other_checkouts_package(tmp_path: Path) -> None:
    other = tmp_path / "old"
    (other / "filters").mkdir(parents=True)
    (other / "filters" / "__init__.py").write_text("WHERE = 'old checkout'\n")
    out = tmp_path / "out.txt"
    code = f"import filters, pathlib; pathlib.Path({str(out)!r}).write_text(filters.WHERE)"
    env, cwd = checkout(other)
    assert cwd == other.resolve()
    child = Child("probe", [sys.executable, "-c", code], tmp_path / "probe.log", env=env, cwd=cwd)
    child.start()
    for _ in range(200):
        if not child.alive():
            break
        await asyncio.sleep(0.05)
    await child.aclose(1.0)
    assert out.read_text() == "old checkout"  # not this repository's filters package
