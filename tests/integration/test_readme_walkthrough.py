"""README.md's walkthrough, run top to bottom as printed against `tokenweir up` of the example:
from "First contact" to the first burst of "Overload", each indented command block is run as a
user pastes it (in a folder laid out like the repository: `examples/mesh.yaml`, `.venv/`), and
the request counts its `# ...` lines show are what it printed.

The README once showed "free: 8 of 8 streamed" right after a loop that drains the free tenant's
bucket: pasted in order, the free requests got 429. Ports are moved to free ones (the gateway's
`127.0.0.1:10000` in the commands with it); timings are not compared.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_up_port_plan import moved_example
from tests.integration.up_process import ROOT, start_up, stop_up

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_COUNTS = re.compile(r"(\w+): (\d+) of (\d+) streamed")


def walkthrough(readme: str) -> list[tuple[list[str], str, list[str]]]:
    """``(argv prefix, code, expected output lines)`` of each block from "First contact" up to
    the capacity change of "Overload": indented blocks run in bash, fenced ``python`` blocks in
    the venv's Python."""
    start = readme.index("## First contact")
    end = readme.index("Now give the pool the capacity", start)
    blocks: list[tuple[list[str], str, list[str]]] = []
    current: list[str] = []
    fenced: list[str] | None = None
    for line in [*readme[start:end].splitlines(), ""]:
        if line.startswith("```"):
            if fenced is None:
                fenced = []
            else:
                blocks.append(([".venv/bin/python", "-c"], "\n".join(fenced), []))
                fenced = None
        elif fenced is not None:
            fenced.append(line)
        elif line.startswith("    "):
            current.append(line[4:])
        elif current:
            code = [x for x in current if not x.startswith("# ")]
            shown = [x[2:] for x in current if x.startswith("# ")]
            blocks.append((["bash", "-c"], "\n".join(code), shown))
            current = []
    return blocks


def test_the_walkthrough_blocks_are_found() -> None:
    blocks = walkthrough((ROOT / "README.md").read_text())
    commands = "\n".join(code for _, code, _ in blocks)
    assert "tw-demo-free-key" in commands and "examples/burst.py --pro 40 --free 8" in commands
    assert "from openai import OpenAI" in commands
    assert any(_COUNTS.search(line) for _, _, shown in blocks for line in shown)


def test_readme_walkthrough_prints_what_it_shows(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    # a loaded 2-core CI box: the example's 50 ms RLS timeout lets a burst through unchecked
    # (failure_mode_deny: false, fail open) and its 200 ms ext_proc one answers 504; a laptop's
    # figures in the README are what the walkthrough checks, not the box's speed
    text = moved_example().replace("timeout: 50ms", "timeout: 1s")
    text = text.replace("message_timeout: 200ms", "message_timeout: 2s")
    (tmp_path / "examples" / "mesh.yaml").write_text(text)
    shutil.copy(ROOT / "examples" / "burst.py", tmp_path / "examples" / "burst.py")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    text = (tmp_path / "examples" / "mesh.yaml").read_text()
    gw = re.search(r"listen: (127\.0\.0\.1:\d+)", text).group(1)  # type: ignore[union-attr]
    proc, banner = start_up(
        tmp_path / "examples" / "mesh.yaml", tmp_path / "run", 180, ("--fresh",)
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        assert "tokenweir up: ready" in banner, banner
        for argv, code, shown in walkthrough((ROOT / "README.md").read_text()):
            code = code.replace("127.0.0.1:10000", gw)
            code = code.replace("burst.py", f"burst.py --url http://{gw}/v1/chat/completions")
            run = subprocess.run(
                [*argv, code], cwd=tmp_path, env=env, capture_output=True, text=True,
                timeout=120,
            )  # fmt: skip
            assert run.returncode == 0, (code, run.stdout, run.stderr)
            printed = {m.group(1): m.group(2, 3) for m in _COUNTS.finditer(run.stdout)}
            for line in shown:
                if m := _COUNTS.search(line):
                    assert printed.get(m.group(1)) == m.group(2, 3), (code, line, run.stdout)
    finally:
        rest = stop_up(proc, timeout=60)
    assert proc.returncode == 0, banner + rest
