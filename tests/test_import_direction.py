"""Imports point one way: down the layers of docs/architecture.md ("The layers").

::

    roof      tokenweir                              the CLI, `tokenweir up`, what only they start
    services  controlplane, filters,                 never import each other (the control plane
              ratelimit_service, backends            reads backends' profiles and SGLang parsers)
    core      controlplane.translate, .xds           policy → Envoy resources, the xDS server
    domain    quota, prefixindex, poolstate, chat    shared by the services, owned by none
    ground    policy, wire | runtime                 the model and the wire contract | the
                                                     infrastructure; each imports nothing of ours
                                                     (policy reads wire's names)

Parsed from the source (AST), lazy and ``TYPE_CHECKING`` imports inside functions included. A
module may import its own layer and the layers below it; besides imports, a string naming a
module of ours (``"pkg.mod:function"``, ``"-m", "pkg.mod"``) counts as an import by name, so a
lower layer cannot load a higher one that way either. No two files may import each other, even
through others (a file-level cycle).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (layer, packages), bottom first; a package listed before its parent wins (controlplane.xds)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("wire", ("wire",)),
    ("policy", ("policy",)),
    ("runtime", ("runtime",)),
    ("domain", ("quota", "prefixindex", "poolstate", "chat")),
    ("core", ("controlplane.translate", "controlplane.xds")),
    ("services", ("controlplane", "filters", "ratelimit_service", "backends", "batch_service")),
    ("roof", ("tokenweir",)),
)
OURS = tuple(p for _, packages in LAYERS for p in packages if "." not in p)
# what each layer may import besides itself (and, for services, besides their own package)
BELOW: dict[str, tuple[str, ...]] = {
    "wire": (),
    "policy": ("wire",),
    "runtime": ("wire",),  # its JSON shapes (wire/jsontypes.py) and nothing else
    "domain": ("wire", "policy", "runtime"),
    "core": ("wire", "policy", "runtime", "domain"),
    "services": ("wire", "policy", "runtime", "domain", "core"),
    "roof": ("wire", "policy", "runtime", "domain", "core", "services"),
}
SERVICE_READS = {"controlplane": ("backends",)}  # the hardware profiles, SGLang's /server_info
BY_NAME = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)(?::[A-Za-z_]\w*)?$")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layer_of(module: str) -> tuple[str, str]:
    """(layer, package) of a module of ours: the longest package prefix that names it."""
    best = ("", "")
    for layer, packages in LAYERS:
        for p in packages:
            if _within(module, (p,)) and len(p) > len(best[1]):
                best = (layer, p)
    return best


def allowed(importer: str, imported: str) -> bool:
    (a, own), (b, other) = layer_of(importer), layer_of(imported)
    if b in BELOW[a]:
        return True
    if a != b:
        return False
    if a != "services" or own == other:
        return True
    return other in SERVICE_READS.get(own, ())


def _module(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, root: Path) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str, str]]:
    """(line, imported module, how) for every import of our packages in ``path``; ``how`` is
    "import" or "by name" (a string constant naming a module of ours)."""
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
            subs = [f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}", root)]
            names = subs if len(subs) == len(node.names) else [base, *subs]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = BY_NAME.match(node.value)
            named = m is not None and ("." in m[1] or ":" in node.value)
            if m is not None and named and _within(m[1], OURS) and _is_module(m[1], root):
                yield node.lineno, m[1], "by name"
            continue
        for name in names:
            if _within(name, OURS):
                yield node.lineno, name, "import"


def edges(root: Path = ROOT) -> list[tuple[str, str, str, str]]:
    """(where, importer, imported, how) for every import of our packages under ``root``."""
    found = []
    for package in OURS:
        for path in sorted((root / package).rglob("*.py")):
            importer = _module(path, root)
            for line, imported, how in imports(path, root):
                found.append((f"{path.relative_to(root)}:{line}", importer, imported, how))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    scc.append(top)
                    if top == node:
                        break
                if len(scc) > 1:
                    out.append(sorted(scc))
    return out


@pytest.fixture(scope="module")
def our_edges() -> list[tuple[str, str, str, str]]:
    """The imports of the whole tree, parsed once for the tests that read them (~10 s of AST)."""
    return edges()


def test_imports_point_down_the_layers(our_edges: list[tuple[str, str, str, str]]) -> None:
    bad = [
        f"{where}: {a} ({layer_of(a)[0]}) {'loads' if how == 'by name' else 'imports'} "
        f"{b} ({layer_of(b)[0]}){' by name' if how == 'by name' else ''}"
        for where, a, b, how in our_edges
        if not allowed(a, b)
    ]
    assert bad == []


def test_no_file_level_cycles(our_edges: list[tuple[str, str, str, str]]) -> None:
    graph: dict[str, set[str]] = {}
    for _, a, b, how in our_edges:
        if how == "import" and a != b:
            graph.setdefault(a, set()).add(b)
    assert cycles(graph) == []


def test_every_package_of_ours_has_a_layer() -> None:
    tops = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")
    assert [t for t in tops if not layer_of(t)[0]] == []


@pytest.mark.parametrize(
    ("importer", "imported", "ok"),
    [
        ("controlplane.translate.ext_proc", "filters.phases", False),
        ("controlplane.xds.server", "controlplane.reloader", False),
        ("controlplane.translate.ext_proc", "policy.phases", True),
        ("controlplane.translate.ratelimit", "wire.contract", True),
        ("policy.phases", "wire.contract", True),
        ("wire.contract", "policy.model", False),
        ("policy.model", "runtime.tasks", False),
        ("runtime.process", "filters.app", False),
        ("runtime.watcher", "policy", False),
        ("runtime.children", "tokenweir.up", False),
        ("quota.config", "policy.model", True),
        ("quota.reader", "runtime.tasks", True),
        ("poolstate.ladder", "filters.plugins.degrade", False),
        ("filters.h2server", "ratelimit_service.h2server", False),
        ("filters.budget", "quota.reader", True),
        ("ratelimit_service.server", "filters.keys", False),
        ("backends.emulator.app", "runtime.ports", True),
        ("backends.emulator.server", "controlplane.app", False),
        ("controlplane.saturation.scraper", "backends.sglang.capacity", True),
        ("controlplane.app", "tokenweir.check", False),
        ("tokenweir.up", "filters.app", True),  # the roof starts the services
    ],
)
def test_the_rules(importer: str, imported: str, ok: bool) -> None:
    assert allowed(importer, imported) is ok


def test_lazy_relative_and_by_name_imports_are_seen(tmp_path: Path) -> None:
    pkg = tmp_path / "controlplane" / "translate"
    pkg.mkdir(parents=True)
    (tmp_path / "filters").mkdir()
    (tmp_path / "filters" / "__init__.py").write_text("")
    (tmp_path / "filters" / "app.py").write_text("")
    (pkg / "names.py").write_text("")
    (pkg / "x.py").write_text(
        "def f():\n    from filters.phases import route_hooks\nfrom .names import X\n"
        'T = "filters.app:prepare"\nL = "filters.plugins.picker"\n'
    )
    found = sorted((n, how) for _, n, how in imports(pkg / "x.py", tmp_path))
    assert found == [
        ("controlplane.translate.names", "import"),
        ("filters.app", "by name"),
        ("filters.phases", "import"),
    ]


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
