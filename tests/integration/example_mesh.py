"""examples/mesh.yaml for a test's `tokenweir up`: every fixed port moved to a free one, the
emulators sped up, and, for a test that checks none of them, parts of the example left out (fewer
processes to start on a loaded box). The variants are edits of the example's own text, each
asserted to match once: a changed example fails here, loudly, rather than drifting from a copy.

Left out on request: the chat pool's replicas beyond ``replicas``; the batch API, its runner and
routes (``batch=False``); the inventory sidecar Envoy (``sidecar=False``); the fallback pool
``chat-small``, the pool's ``fallback`` and the ladder's fallback step (``fallback=False``)."""

from __future__ import annotations

import re

from tests.helpers import free_port, free_port_block
from tests.integration.up_process import ROOT

__all__ = ["example_policy"]


def example_policy(
    time_scale: float = 0.02,
    *,
    replicas: int = 3,
    batch: bool = True,
    sidecar: bool = True,
    fallback: bool = True,
) -> tuple[str, int]:
    """The example's text, ports moved, and the edge gateway's port."""
    text = (ROOT / "examples" / "mesh.yaml").read_text()
    text = _sub(r"\n      replicas: 3\n", f"\n      replicas: {replicas}\n", text)
    base = free_port_block(replicas)
    text = _sub(r"base_port: 30001\b", f"base_port: {base}\n      time_scale: {time_scale}", text)
    if fallback:
        small = free_port_block(1)  # the fallback pool's replica (a flow mapping)
        text = _sub(r"base_port: 30011\}", f"base_port: {small}, time_scale: {time_scale}}}", text)
    else:
        for first in ("  chat-small:", "    fallback: chat-small", "        - {action: fallback"):
            text = _drop(first, text)
    if not batch:
        for first in ("batch:", "  batch-api:", *(f"      - name: batch-{r}" for r in ROUTES)):
            text = _drop(first, text)
    if not sidecar:
        text = _drop("sidecars:", text)
    moved: dict[str, int] = {}  # every fixed port of the example, metrics ports included

    def move(m: re.Match[str]) -> str:
        return f"{m.group(1)}{moved.setdefault(m.group(2), free_port())}"

    text = re.sub(r"(127\.0\.0\.1:|metrics_port: )(\d+)", move, text)
    return text, moved["10000"]


ROUTES = ("files", "jobs", "lines")  # the batch API's two routes and the runner's lines' route


def _sub(pattern: str, new: str, text: str) -> str:
    out, n = re.subn(pattern, new, text)
    assert n == 1, f"examples/mesh.yaml changed: {pattern!r} matched {n} times, not once"
    return out


def _drop(first: str, text: str) -> str:
    """``text`` without the block that starts with the one line beginning with ``first``: that
    line and the lines below it indented deeper (a YAML mapping entry or list item)."""
    lines = text.splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith(first)]
    assert len(at) == 1, f"examples/mesh.yaml changed: {len(at)} lines start with {first!r}"
    (i,) = at
    indent = _indent(first)
    end = i + 1
    while end < len(lines) and lines[end].strip() and _indent(lines[end]) > indent:
        end += 1
    return "".join(lines[:i] + lines[end:])


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))
