"""The names on the wire are written once, in wire/contract.py (docs/architecture.md).

Every header, dynamic-metadata name and descriptor entry that Envoy, the filter server and the
rate-limit service share is a constant there; a product module that spells one of them as a
string literal again would let the two sides drift apart. The Lua usage meter cannot import
Python: its literals are held to the constants instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from wire import contract

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = (
    "policy", "wire", "runtime", "quota", "prefixindex", "poolstate", "chat",
    "controlplane", "filters", "ratelimit_service", "backends", "tokenweir",
)  # fmt: skip
# the names worth guarding: every x-tokenweir-* header and the dynamic-metadata keys (descriptor
# keys such as "model" or "request_id" are ordinary words elsewhere and are not searched for)
GUARDED = {
    v for k, v in vars(contract).items()
    if k.isupper() and isinstance(v, str) and v.startswith("x-tokenweir-")
} | {contract.METADATA_NAMESPACE + ":", contract.SETTLE_KEY, contract.SETTLE_USD_KEY}  # fmt: skip


def literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_no_product_module_spells_a_wire_name_again() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {value!r}"
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "wire" / "contract.py"
        for line, value in literals(path)
        if value in GUARDED
    ]
    assert found == []


def test_the_guard_sees_a_literal(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text('"""doc x-tokenweir-model"""\nH = {"x-tokenweir-model": 1}\n')
    assert [v for _, v in literals(bad) if v in GUARDED] == ["x-tokenweir-model"]


def test_the_lua_meter_uses_the_contract_names() -> None:
    lua = (ROOT / "controlplane" / "translate" / "usage.lua").read_text()
    assert re.search(rf'local TW = "{contract.METADATA_NAMESPACE}"', lua)
    keys = set(re.findall(r'md:set\(TW, "([a-z_]+)"', lua))
    assert {contract.SETTLE_KEY, contract.SETTLE_USD_KEY} <= keys
