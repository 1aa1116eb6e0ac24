#!/usr/bin/env python3
"""Issue 35's package moves, replayable: ``python scripts/relayout.py`` from the repository root.

One table, MOVES, of old → new paths (a file or a whole folder). The script

1. ``git mv``s every tracked file that still lies at an old path to its new path (a folder moves
   file by file, so a file added there later moves too; one already moved is left alone), fixes
   ``Path(__file__)...parents[N]`` in a moved Python file whose folder depth changed, and removes
   what is left of an emptied old folder (``__pycache__``, so no stale namespace package hides a
   missed import);
2. writes the ``__init__.py`` of each new package that has none (NEW_PACKAGES);
3. rewrites, in every tracked text file, the references to old paths by pattern, not by a file
   list, so it also mends files written after this script on another branch:
   dotted names (``import a.b``, ``from a.b import c``, ``"a.b:func"``, ``python -m a.b``, mock
   targets, entry points), ``from a import b`` where ``a.b`` moved to another parent, and file
   paths (``controlplane/policy/model.py``, ``../runtime/quota/`` in a docs link);
4. lists the new top-level packages in pyproject.toml (setuptools ``include``, mypy
   ``packages``) and in the Dockerfiles that copy packages one by one and sorts the import blocks it changed (``ruff check --select I --fix``).

Running it twice changes nothing: a new name that extends its old one (a plugin module that
became a folder: ``filters.plugins.tokens`` → ``filters.plugins.tokens.plugin``) is not extended
again, and a move whose old path is gone is skipped. It prints what it did, and what it could not mend (a relative import that no
longer resolves, a path built from separate strings) for a hand edit.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# old path → new path (repository-relative; a folder without a trailing slash, a file with .py)
MOVES: list[tuple[str, str]] = [
    # ground: the policy model (the wire contract, wire/, is new)
    ("controlplane/policy", "policy"),
    ("runtime/labels.py", "policy/labels.py"),
    # shared domain, out of runtime/ (runtime/ keeps the infrastructure)
    ("runtime/quota", "quota"),
    ("runtime/cost.py", "quota/cost.py"),
    ("runtime/prefixindex", "prefixindex"),
    ("runtime/poolstate", "poolstate"),
    ("runtime/chat_tokenizer.py", "chat/tokenizer.py"),
    # the roof: the CLI, `tokenweir up` and what only they start
    ("controlplane/cli.py", "tokenweir/cli.py"),
    ("controlplane/check.py", "tokenweir/check.py"),
    ("controlplane/up.py", "tokenweir/up.py"),
    ("controlplane/up_cli.py", "tokenweir/up_cli.py"),
    ("controlplane/up_parts.py", "tokenweir/up_parts.py"),
    ("controlplane/quota_cli.py", "tokenweir/quota_cli.py"),
    ("controlplane/shadow_cli.py", "tokenweir/shadow_cli.py"),
    ("controlplane/status_cli.py", "tokenweir/status_cli.py"),
    ("controlplane/admin_args.py", "tokenweir/admin_args.py"),
    ("controlplane/envoy_launcher.py", "tokenweir/envoy_launcher.py"),
    ("controlplane/restarter.py", "tokenweir/restarter.py"),
    ("controlplane/prometheus.py", "tokenweir/prometheus.py"),
    # part 3: each built-in plugin in its own folder under filters/plugins/, helpers beside it
    ("filters/admission", "filters/plugins/admission"),
    ("filters/collapse", "filters/plugins/collapse"),
    ("filters/idempotency", "filters/plugins/idempotency"),
    ("filters/ladder", "filters/plugins/degrade"),
    ("filters/pd", "filters/plugins/pd"),
    ("filters/picker", "filters/plugins/picker"),
    ("filters/shadow", "filters/plugins/shadow"),
    ("filters/stop.py", "filters/plugins/usage/stop.py"),
    ("filters/plugins/canary.py", "filters/plugins/canary/plugin.py"),
    ("filters/plugins/identity.py", "filters/plugins/identity/plugin.py"),
    ("filters/plugins/lane.py", "filters/plugins/lane/plugin.py"),
    ("filters/plugins/prefix.py", "filters/plugins/prefix/plugin.py"),
    ("filters/plugins/tokens.py", "filters/plugins/tokens/plugin.py"),
    ("filters/plugins/usage.py", "filters/plugins/usage/plugin.py"),
    # tests mirror the packages
    ("tests/controlplane/policy", "tests/policy"),
    ("tests/runtime/test_labels.py", "tests/policy/test_labels.py"),
    ("tests/runtime/poolstate", "tests/poolstate"),
    ("tests/runtime/prefixindex", "tests/prefixindex"),
    ("tests/runtime/test_chat_tokenizer.py", "tests/chat/test_tokenizer.py"),
    ("tests/controlplane/test_check.py", "tests/tokenweir/test_check.py"),
    ("tests/controlplane/test_cli_grammar.py", "tests/tokenweir/test_cli_grammar.py"),
    ("tests/controlplane/test_envoy_launcher.py", "tests/tokenweir/test_envoy_launcher.py"),
    ("tests/controlplane/test_prometheus.py", "tests/tokenweir/test_prometheus.py"),
    ("tests/controlplane/test_restarter.py", "tests/tokenweir/test_restarter.py"),
    ("tests/controlplane/test_status_cli.py", "tests/tokenweir/test_status_cli.py"),
    ("tests/controlplane/test_up_parts.py", "tests/tokenweir/test_up_parts.py"),
    # patterns (a new `up` part or admin CLI written on another branch goes to the roof too)
    ("controlplane/up_*.py", "tokenweir/"),
    ("controlplane/*_cli.py", "tokenweir/"),
    ("tests/controlplane/test_up_*.py", "tests/tokenweir/"),
    ("tests/controlplane/test_*_cli.py", "tests/tokenweir/"),
]

# new packages and the __init__.py each gets when it has none
NEW_PACKAGES: dict[str, str] = {
    "chat": '"""Chat prompts as a model sees them: its own tokenizer and chat template."""\n',
    "tokenweir": (
        '"""The roof: the ``tokenweir`` CLI, ``tokenweir up`` and the processes only they start.\n'
        "\n"
        'It imports every layer below it; nothing imports it (docs/architecture.md, "Layers").\n'
        '"""\n'
    ),
    "wire": (
        '"""The wire contract between Envoy, the filter server and the rate-limit service.\n'
        "\n"
        'Ground layer: imports nothing of ours (docs/architecture.md, "Layers").\n'
        '"""\n'
    ),
    "tests/chat": "",
    "tests/tokenweir": "",
    **{
        f"filters/plugins/{name}": f'"""The ``{name}`` plugin (filters/plugins/{name}/plugin.py)."""\n'
        for name in ("canary", "identity", "lane", "prefix", "tokens", "usage")
    },
}

# top-level packages, in the order pyproject.toml lists them
PACKAGES = [
    "controlplane",
    "ratelimit_service",
    "filters",
    "backends",
    "runtime",
    "policy",
    "wire",
    "quota",
    "prefixindex",
    "poolstate",
    "chat",
    "batch_service",
    "tokenweir",
]

TEXT_SUFFIXES = {
    ".py",
    ".pyi",
    ".md",
    ".toml",
    ".yaml",
    ".yml",
    ".sh",
    ".lua",
    ".js",
    ".json",
    ".cfg",
}
TEXT_NAMES = {"Makefile", "Dockerfile"}
SKIP = {"scripts/relayout.py"}  # its table must keep the old names
SKIP_UNDER = ("bench/results/",)  # recorded results stay as they were recorded


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def tracked() -> list[str]:
    return [p for p in git("ls-files", "-z").split("\0") if p]


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def expand(files: list[str]) -> None:
    """Each pattern row of MOVES (``*`` in the old path) becomes one row per tracked file it
    matches, in place; a file that a plain row moves already is left to that row."""
    plain = {o for o, _ in MOVES if "*" not in o}
    rows: list[tuple[str, str]] = []
    for old, new in MOVES:
        if "*" not in old:
            rows.append((old, new))
            continue
        for f in files:
            row = (f, new + Path(f).name)
            same_folder = "/" not in f[len(old.split("*")[0]) :]
            if fnmatch.fnmatchcase(f, old) and same_folder and f not in plain and row not in rows:
                rows.append(row)
    MOVES[:] = rows
    _compile()


# -- 1. moves --------------------------------------------------------------------------------
def move(files: list[str]) -> list[tuple[str, str]]:
    moved = []
    present = set(files)
    for old, new in MOVES:
        if old.endswith(".py"):
            pairs = [(old, new)] if old in present else []
        else:
            pairs = [(f, new + f[len(old) :]) for f in files if f.startswith(old + "/")]
        for src, dst in pairs:
            if src not in present or Path(dst).exists():
                if Path(dst).exists() and src in present:
                    print(f"  both exist, left for a hand merge: {src} and {dst}")
                continue
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            git("mv", src, dst)
            moved.append((src, dst))
    for old, _ in MOVES:
        folder = Path(old) if not old.endswith(".py") else None
        if folder is not None and folder.is_dir() and not git("ls-files", old).strip():
            shutil.rmtree(folder)
    return moved


_PARENTS = re.compile(r"(__file__\)(?:\.resolve\(\))?\.parents\[)(\d+)(\])")


_SIBLING = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?\.parent / \"(\w+)\"")


def _sibling(src: str, dst: str, m: re.Match[str]) -> str:
    """``Path(__file__).parent / "x"`` where x moved too: the path from the new place."""
    old = f"{Path(src).parent}/{m[1]}"
    new = dict(MOVES).get(old)
    if new is None:
        return m[0]
    rel = Path(os.path.relpath(new, Path(dst).parent)).parts
    up = sum(1 for r in rel if r == "..")
    head = "Path(__file__).parent" if not up else f"Path(__file__).parents[{up}]"
    return head + "".join(f' / "{r}"' for r in rel[up:])


def fix_depth(src: str, dst: str) -> bool:
    delta = dst.count("/") - src.count("/")
    if not dst.endswith(".py") or Path(src).parent == Path(dst).parent:
        return False
    p = Path(dst)
    text = p.read_text()
    new = _PARENTS.sub(lambda m: f"{m[1]}{int(m[2]) + delta}{m[3]}", text) if delta else text
    new = _SIBLING.sub(lambda m: _sibling(src, dst, m), new)
    if new != text:
        p.write_text(new)
    return new != text


# -- 2. new packages -------------------------------------------------------------------------
def packages() -> list[str]:
    made = []
    for pkg, text in NEW_PACKAGES.items():
        init = Path(pkg) / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text(text)
            git("add", str(init))
            made.append(str(init))
    return made


# -- 3. references ---------------------------------------------------------------------------
def _table() -> tuple[dict[str, str], dict[str, str]]:
    rows = [(o, n) for o, n in MOVES if "*" not in o]  # patterns count once expanded
    mods = {dotted(o): dotted(n) for o, n in rows}
    paths = dict(rows)
    return mods, paths


def _alternation(keys: list[str]) -> str:
    return "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))


def _compile() -> None:
    """The patterns of the current table (again after :func:`expand`)."""
    global MODS, PATHS, DOTTED, PATH, PARTS
    MODS, PATHS = _table()
    # a dotted name: not preceded by a name character or a dot, not continued by a name character
    DOTTED = re.compile(rf"(?<![\w.]){'(' + _alternation(list(MODS)) + ')'}(?![\w])")
    # a path: at a word's start, or after ./ or ../ (a docs link); not continued by a name
    # character
    PATH = re.compile(rf"(?:(?<=\./)|(?<![\w./-])){'(' + _alternation(list(PATHS)) + ')'}(?![\w-])")
    # a path built from quoted parts: ROOT / "tests" / "controlplane" / "policy"
    PARTS = re.compile(
        r"(?P<q>[\"'])(?:"
        + "|".join(
            f"(?P<m{i}>{_segments(o)})"
            for i, (o, _) in sorted(enumerate(MOVES), key=lambda e: -e[1][0].count("/"))
            if "/" in o
        )
        + ")"
    )


def _segments(path: str) -> str:
    return r"\s*/\s*".join(rf"(?P=q){re.escape(s)}(?P=q)" for s in path.split("/"))[6:]


def _parts(m: re.Match[str]) -> str:
    i = int(next(k for k, v in m.groupdict().items() if k != "q" and v is not None)[1:])
    q = m["q"]
    return q + f"{q} / {q}".join(MOVES[i][1].split("/")) + q


MODS: dict[str, str] = {}
PATHS: dict[str, str] = {}
DOTTED = PATH = PARTS = re.compile("")
_compile()
FROM_IMPORT = re.compile(r"^(\s*from\s+)([\w.]+)(\s+import\s+)([\w, ]+?)(\s*(?:#.*)?)$", re.M)


def _from_parent(m: re.Match[str]) -> str:
    """``from a import b`` where ``a.b`` moved under another parent: ``from a2 import b2``."""
    base, names = m[2], [n.strip() for n in m[4].split(",")]
    targets = []
    for n in names:
        name, _, alias = n.partition(" as ")
        new = MODS.get(f"{base}.{name.strip()}")
        if new is None:
            return m[0]
        parent, _, leaf = new.rpartition(".")
        alias = alias.strip() or (name.strip() if leaf != name.strip() else "")
        targets.append((parent, leaf + (f" as {alias}" if alias else "")))
    parents = {p for p, _ in targets}
    if len(parents) != 1 or not next(iter(parents)):
        return m[0]
    return f"{m[1]}{parents.pop()}{m[3]}{', '.join(t for _, t in targets)}{m[5]}"


_NEXT = re.compile(r"(?:\.|\s+import\s+)(\w+)")


def _dotted(m: re.Match[str]) -> str:
    """The new dotted name, unless the old one names a module that became a folder and goes on
    to a module of that folder (``filters.plugins.usage.stop``, ``.plugin`` itself, or
    ``from filters.plugins.tokens import plugin``): those are moved already."""
    old, new = m[1], MODS[m[1]]
    if new.startswith(old + "."):
        nxt = _NEXT.match(m.string, m.end())
        folder = Path(*old.split("."))
        if nxt and ((folder / f"{nxt[1]}.py").is_file() or (folder / nxt[1]).is_dir()):
            return m[0]
    return new


def rewrite_text(text: str) -> str:
    # dotted names first: a ``from a import b`` that the next step writes as ``from a.b import
    # plugin`` (b a module that became a folder) is then not extended again
    text = DOTTED.sub(_dotted, text)
    text = FROM_IMPORT.sub(_from_parent, text)
    text = PARTS.sub(_parts, text)
    return PATH.sub(lambda m: PATHS[m[1]], text)


def is_text(path: str) -> bool:
    p = Path(path)
    if path in SKIP or path.startswith(SKIP_UNDER) or not p.is_file() or p.is_symlink():
        return False
    return (
        p.suffix in TEXT_SUFFIXES
        or p.name in TEXT_NAMES
        or p.name.startswith("Dockerfile")
        or path.startswith(".ci/")
    )


def rewrite(files: list[str]) -> list[str]:
    changed = []
    for f in files:
        if not is_text(f):
            continue
        p = Path(f)
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite_text(text)
        if new != text:
            p.write_text(new)
            changed.append(f)
    return changed


# -- 4. pyproject and import order -----------------------------------------------------------
def pyproject() -> bool:
    p = Path("pyproject.toml")
    text = p.read_text()
    present = [pkg for pkg in PACKAGES if (Path(pkg) / "__init__.py").exists()]
    include = "include = [" + ", ".join(f'"{pkg}*"' for pkg in present) + "]"
    mypy = "packages = [" + ", ".join(f'"{pkg}"' for pkg in present) + "]"
    new = re.sub(r'^include = \["controlplane\*".*\]$', include, text, flags=re.M)
    new = re.sub(r'^packages = \["controlplane".*\]$', mypy, new, flags=re.M)
    if new != text:
        p.write_text(new)
    return new != text


def dockerfiles(files: list[str]) -> list[str]:
    """Images that copy the packages one by one (``COPY runtime runtime``) copy the new ones."""
    changed = []
    present = [pkg for pkg in PACKAGES if (Path(pkg) / "__init__.py").exists()]
    for f in files:
        if not Path(f).name.startswith("Dockerfile") or not Path(f).is_file():
            continue
        text = Path(f).read_text()
        copied = re.findall(r"^COPY (\w+) \1$", text, re.M)
        if not copied:
            continue
        missing = [pkg for pkg in present if pkg not in copied]
        if missing:
            last = re.findall(r"^COPY \w+ \w+$", text, re.M)[-1]
            add = "".join(f"\nCOPY {pkg} {pkg}" for pkg in missing)
            Path(f).write_text(text.replace(last + "\n", last + add + "\n", 1))
            changed.append(f)
    return changed


def sort_imports(changed: list[str]) -> None:
    py = [f for f in changed if f.endswith(".py") and Path(f).exists()]
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if py and Path(ruff).exists():
        subprocess.run(
            [ruff, "check", "-q", "--select", "I", "--fix", *py], check=False, capture_output=True
        )
        subprocess.run([ruff, "format", "-q", *py], check=False, capture_output=True)
    elif py:
        print("  ruff not found: import blocks left unsorted (run `ruff check --select I --fix`)")


# -- what is left for a hand -----------------------------------------------------------------
def _module_exists(name: str) -> bool:
    base = Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def leftovers(files: list[str]) -> list[str]:
    notes = []
    olds = [o for o, _ in MOVES]
    built = re.compile(
        r'["\'](' + "|".join(re.escape(o.split("/")[0]) for o in olds) + r')["\']\s*/'
    )
    for f in files:
        if not f.endswith(".py") or f in SKIP or not Path(f).is_file():
            continue
        text = Path(f).read_text()
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        pkg = dotted(f).rsplit(".", 1)[0] if not f.endswith("__init__.py") else dotted(f)[:-9]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
                if not _module_exists(target) and not all(
                    _module_exists(f"{target}.{a.name}") for a in node.names
                ):
                    notes.append(
                        f"{f}:{node.lineno}: relative import of {target} resolves to nothing"
                    )
        for i, line in enumerate(text.splitlines(), 1):
            if built.search(line):
                for old in olds:
                    segs = old.removesuffix(".py").split("/")
                    if len(segs) > 1 and all(f'"{s}' in line or f"'{s}" in line for s in segs):
                        notes.append(f"{f}:{i}: a path built from parts may name {old}")
    return notes


def main() -> int:
    root = Path(git("rev-parse", "--show-toplevel").strip())
    os.chdir(root)
    expand(tracked())
    moved = move(tracked())
    depth = [dst for src, dst in moved if fix_depth(src, dst)]
    made = packages()
    files = tracked()
    changed = rewrite(files)
    if pyproject():
        changed.append("pyproject.toml")
    changed += dockerfiles(files)
    sort_imports(changed + depth)
    print(f"moved {len(moved)} files, made {len(made)} __init__.py, rewrote {len(changed)} files")
    for dst in depth:
        print(f"  Path(__file__) fixed: {dst}")
    for note in leftovers(files):
        print(f"  by hand: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
