"""Imports point one way (CONVENTIONS.md): services → runtime → the policy model.

Parsed from the source (AST), lazy imports inside functions included:
- the control plane's core (``policy``, ``.translate``, ``.xds``) imports only the
  core and the runtime, never a service or the control plane's own servers and CLI;
- ``runtime`` imports only ``runtime`` and the policy model (so nothing it pulls in imports a
  service);
- the services ``filters``, ``ratelimit_service`` and ``backends`` never import each other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("controlplane", "filters", "ratelimit_service", "backends", "runtime")
CORE = ("policy", "controlplane.translate", "controlplane.xds")
SERVICES = ("filters", "ratelimit_service", "backends")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _module(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import of our packages in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    module = _module(path, root)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            names = [base]
        for name in names:
            if _within(name, OURS):
                yield node.lineno, name


def allowed(importer: str, imported: str) -> bool:
    if _within(importer, CORE):
        return _within(imported, (*CORE, "runtime"))
    if _within(importer, ("runtime",)):
        return _within(imported, ("runtime", "policy"))
    for service in SERVICES:
        if _within(importer, (service,)):
            return not _within(imported, tuple(s for s in SERVICES if s != service))
    return True


def edges(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(where, importer, imported) for every import of our packages under ``root``."""
    found = []
    for package in OURS:
        for path in sorted((root / package).rglob("*.py")):
            importer = _module(path, root)
            for line, imported in imports(path, root):
                found.append((f"{path.relative_to(root)}:{line}", importer, imported))
    return found


def test_imports_point_one_way() -> None:
    bad = [f"{where}: {a} imports {b}" for where, a, b in edges() if not allowed(a, b)]
    assert bad == []


@pytest.mark.parametrize(
    ("importer", "imported", "ok"),
    [
        ("controlplane.translate.ext_proc", "filters.phases", False),
        ("controlplane.xds.server", "controlplane.reloader", False),
        ("controlplane.translate.ext_proc", "policy.phases", True),
        ("runtime.process", "filters.app", False),
        ("runtime.children", "tokenweir.up", False),
        ("runtime.metrics_http", "policy.model", True),
        ("filters.h2server", "ratelimit_service.h2server", False),
        ("filters.budget", "ratelimit_service.reader", False),
        ("filters.budget", "quota.reader", True),
        ("ratelimit_service.server", "filters.keys", False),
        ("backends.emulator.app", "runtime.ports", True),
        ("tokenweir.up", "filters.app", True),  # the CLI starts services: allowed
    ],
)
def test_the_rules(importer: str, imported: str, ok: bool) -> None:
    assert allowed(importer, imported) is ok


def test_lazy_and_relative_imports_are_seen(tmp_path: Path) -> None:
    pkg = tmp_path / "controlplane" / "translate"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text(
        "def f():\n    from filters.phases import route_hooks\nfrom .names import X\n"
    )
    found = [n for _, n in imports(pkg / "x.py", tmp_path)]
    assert sorted(found) == ["controlplane.translate.names", "filters.phases"]
