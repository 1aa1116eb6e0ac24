"""Decode a YAML node tree into frozen dataclasses, collecting precise errors.

The schema *is* the dataclasses in :mod:`policy.model`: field names are YAML keys,
type hints say what is allowed, ``Annotated`` markers add ranges, durations and sizes. Unknown
keys, wrong types and out-of-range values all become :class:`Issue` objects with the line of the
offending node, so one run reports every problem in a file.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Annotated,
    Final,
    Literal,
    TypeAlias,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

import yaml

from policy.errors import Issue
from wire.jsontypes import JsonValue

if TYPE_CHECKING:  # typeshed's name for "a dataclass" (no runtime object)
    from _typeshed import DataclassInstance

_T = typing.TypeVar("_T")

__all__ = ["MISSING_NODE", "Decoder", "Duration", "Missing", "Node", "Range", "Size", "doc"]

Node = yaml.Node


@dataclass(frozen=True)
class Range:
    """Inclusive bounds for an int or float field (``None`` = unbounded on that side)."""

    lo: float | None = None
    hi: float | None = None

    def check(self, value: float) -> str | None:
        if self.lo is not None and value < self.lo:
            return f"must be >= {self.lo:g}, got {value:g}"
        if self.hi is not None and value > self.hi:
            return f"must be <= {self.hi:g}, got {value:g}"
        return None


@dataclass(frozen=True)
class Duration:
    """A duration in seconds, written ``250ms``, ``5s``, ``2m``, ``1h`` or a bare number of seconds."""

    lo: float = 0.0
    hi: float | None = None


@dataclass(frozen=True)
class Size:
    """A size in bytes, written ``512``, ``64KiB``, ``1MiB``."""

    lo: int = 0
    hi: int | None = None


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\s*$")
_SIZE_UNITS = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "KB": 1000,
    "MB": 10**6,
    "GB": 10**9,
}


def doc(text: str, **extra: object) -> dict[str, object]:
    """Field metadata helper: ``field(default=..., metadata=doc("what it means"))``."""
    return {"doc": text, **extra}


class Missing:
    """The type of :data:`MISSING_NODE`: what a decode step returns after recording an issue."""


MISSING_NODE: Final = Missing()

# one decode step, worked out per type hint by _plan: the decoded value or MISSING_NODE
Step: TypeAlias = Callable[["Decoder", Node, str], object]


class _FreeForm:
    """What ``JsonValue`` in a schema stands for while the decoder reads the schema's hints:
    free-form data (plugin settings, planner inputs), checked to be plain JSON-like data."""


# the names the schema's hints are evaluated with besides their module's: ``JsonValue`` is a
# recursive alias made for type checkers; to the decoder it means free-form data
_HINT_NAMES: Final[dict[str, object]] = {"JsonValue": _FreeForm}


class Decoder:
    """Turns YAML nodes into values of a type hint; problems go to ``issues``."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.issues: list[Issue] = []
        self._key_line: dict[int, int] = {}  # id(value node) → line of the key that owns it

    # -- reporting -----------------------------------------------------------------------------
    def error(self, node: Node | None, path: str, message: str) -> None:
        line = node.start_mark.line + 1 if node is not None else 0
        self.issues.append(Issue(self.filename, line, path, message))

    # -- entry ---------------------------------------------------------------------------------
    def decode(self, node: Node, hint: object, path: str) -> object:
        """Return the decoded value, or ``MISSING_NODE`` after recording an issue."""
        return _plan(hint)(self, node, path)

    def document(self, node: Node, cls: type[_T]) -> _T | None:
        """The whole document as ``cls``; None after recording issues."""
        value = self.decode(node, cls, "")
        return value if isinstance(value, cls) else None

    # -- structures ----------------------------------------------------------------------------
    def dataclass(self, node: Node, cls: type[DataclassInstance], path: str) -> object:
        pre: Callable[[Decoder, Node, str], Node] | None = getattr(cls, "__shorthand__", None)
        if pre is not None:
            node = pre(self, node, path)
        if not isinstance(node, yaml.MappingNode):
            self.error(node, path, f"expected a mapping with keys {_keys(cls)}, got {_kind(node)}")
            return MISSING_NODE
        steps, fields = _schema(cls)
        values: dict[str, object] = {}
        failed = False
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            sub = _join(path, str(key))
            if key not in fields:
                self.error(key_node, sub, f"unknown key; allowed keys here: {_keys(cls)}")
                failed = True
                continue
            if key in seen:
                self.error(key_node, sub, "duplicate key")
                failed = True
                continue
            seen.add(key)
            self._key_line[id(value_node)] = key_node.start_mark.line + 1
            value = steps[key](self, value_node, sub)
            if value is MISSING_NODE:
                failed = True
            else:
                values[key] = value
        for name, f in fields.items():
            if name in seen:
                continue
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                line = self._key_line.get(id(node), node.start_mark.line + 1)
                self.issues.append(
                    Issue(self.filename, line, _join(path, name), "required key is missing")
                )
                failed = True
        if failed:
            return MISSING_NODE
        try:
            return cls(**values)
        except ValueError as exc:
            self.error(node, path, str(exc))
            return MISSING_NODE

    def _free_form(self, node: Node, path: str) -> JsonValue | Missing:
        """Plain YAML data (plugin settings, planner inputs) as JSON-like values."""
        try:
            return _as_json(yaml.safe_load(yaml.serialize(node)))
        except ValueError as exc:
            self.error(node, path, f"expected plain data ({_PLAIN}), got {exc}")
            return MISSING_NODE

    def _mapping(self, node: Node, value_step: Step, path: str) -> object:
        if _is_null(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            self.error(node, path, f"expected a mapping, got {_kind(node)}")
            return MISSING_NODE
        out: dict[str, object] = {}
        failed = False
        for key_node, value_node in node.value:
            key = str(key_node.value)
            sub = _join(path, key)
            if key in out:
                self.error(key_node, sub, "duplicate key")
                failed = True
                continue
            self._key_line[id(value_node)] = key_node.start_mark.line + 1
            value = value_step(self, value_node, sub)
            if value is MISSING_NODE:
                failed = True
            else:
                out[key] = value
        return MISSING_NODE if failed else out

    def _tuple(self, node: Node, item_step: Step, path: str) -> object:
        if _is_null(node):
            return ()
        if isinstance(node, yaml.ScalarNode):  # a single item may be written without a list
            node = yaml.SequenceNode(
                "tag:yaml.org,2002:seq", [node], node.start_mark, node.end_mark
            )
        if not isinstance(node, yaml.SequenceNode):
            self.error(node, path, f"expected a list, got {_kind(node)}")
            return MISSING_NODE
        items = [item_step(self, item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        return MISSING_NODE if any(i is MISSING_NODE for i in items) else tuple(items)

    def _literal(self, node: Node, choices: tuple[object, ...], path: str) -> object:
        if isinstance(node, yaml.ScalarNode):
            for choice in choices:
                if node.value == str(choice):
                    return choice
        allowed = ", ".join(repr(c) for c in choices)
        self.error(node, path, f"must be one of {allowed}, got {_show(node)}")
        return MISSING_NODE

    def _annotated(
        self, node: Node, base_step: Step, markers: tuple[object, ...], path: str
    ) -> object:
        for marker in markers:
            if isinstance(marker, Duration):
                return self._duration(node, marker, path)
            if isinstance(marker, Size):
                return self._size(node, marker, path)
        value = base_step(self, node, path)
        if value is MISSING_NODE or value is None:
            return value
        for marker in markers:
            # (int, float): a tuple, no union object built per check
            if isinstance(marker, Range) and isinstance(value, (int, float)):
                problem = marker.check(value)
                if problem:
                    self.error(node, path, problem)
                    return MISSING_NODE
        return value

    def _duration(self, node: Node, marker: Duration, path: str) -> float | Missing | None:
        if _is_null(node):
            return None
        m = _DURATION_RE.match(str(node.value)) if isinstance(node, yaml.ScalarNode) else None
        if m is None:
            self.error(
                node, path, f"expected a duration like 250ms, 5s, 2m or 1h, got {_show(node)}"
            )
            return MISSING_NODE
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2) or "s"]
        problem = Range(marker.lo, marker.hi).check(seconds)
        if problem:
            self.error(node, path, f"duration {problem} (seconds)")
            return MISSING_NODE
        return seconds

    def _size(self, node: Node, marker: Size, path: str) -> int | Missing:
        m = _SIZE_RE.match(str(node.value)) if isinstance(node, yaml.ScalarNode) else None
        if m is None:
            self.error(node, path, f"expected a size like 512, 64KiB or 1MiB, got {_show(node)}")
            return MISSING_NODE
        size = int(m.group(1)) * _SIZE_UNITS[m.group(2) or "B"]
        problem = Range(marker.lo, marker.hi).check(size)
        if problem:
            self.error(node, path, f"size {problem} (bytes)")
            return MISSING_NODE
        return size


# -- scalars ----------------------------------------------------------------------------------
def _scalar(tag: str, convert: Callable[[str], object], what: str) -> Step:
    def decode(d: Decoder, node: Node, path: str) -> object:
        if isinstance(node, yaml.ScalarNode) and node.tag in tag.split("|"):
            try:
                return convert(node.value)
            except ValueError:
                pass
        d.error(node, path, f"expected {what}, got {_show(node)}")
        return MISSING_NODE

    return decode


_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"
_BOOL = "tag:yaml.org,2002:bool"


def _to_bool(text: str) -> bool:
    return text.lower() in ("true", "yes", "on")


_SCALARS: dict[type, Step] = {
    int: _scalar(_INT, lambda t: int(t.replace("_", ""), 0), "an integer"),
    float: _scalar(f"{_INT}|{_FLOAT}", lambda t: float(t.replace("_", "")), "a number"),
    str: _scalar(f"{_STR}|{_INT}|{_FLOAT}", str, "a string"),
    bool: _scalar(_BOOL, _to_bool, "true or false"),
}


_PLAIN = "text, numbers, true/false, null, lists and mappings with text keys"


def _as_json(value: object) -> JsonValue:
    """``value`` (what ``yaml.safe_load`` gives) when it is JSON-like data; ValueError naming
    the first part that is not (a timestamp, binary data, a set, a mapping key not text)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, JsonValue] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"the mapping key {k!r}")
            out[k] = _as_json(v)
        return out
    raise ValueError(f"{value!r} ({type(value).__name__})")


# -- small helpers ----------------------------------------------------------------------------
@functools.cache
def _plan(hint: object) -> Step:
    """How to decode a type hint, worked out once per hint (``get_origin``/``get_args`` on
    every node were a third of a 10k-tenant load)."""
    if hint is _FreeForm:
        return Decoder._free_form
    origin = get_origin(hint)
    if origin is Annotated:
        base, *markers = get_args(hint)
        base_step, marks = _plan(base), tuple(markers)
        return lambda d, node, path: d._annotated(node, base_step, marks, path)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"policy schema: only Optional[X] unions are supported ({hint!r})")
        inner = _plan(args[0])
        if len(args) == len(get_args(hint)):  # no None among them
            return inner

        def optional(d: Decoder, node: Node, path: str) -> object:
            return None if _is_null(node) else inner(d, node, path)

        return optional
    if origin is Literal:
        choices = get_args(hint)
        return lambda d, node, path: d._literal(node, choices, path)
    if origin is tuple:
        item = _plan(get_args(hint)[0])
        return lambda d, node, path: d._tuple(node, item, path)
    if origin is dict or origin is typing.Mapping:
        value = _plan(get_args(hint)[1])
        return lambda d, node, path: d._mapping(node, value, path)
    custom: Step | None = getattr(hint, "__decode__", None)
    if custom is not None:
        return custom
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        cls = hint
        return lambda d, node, path: d.dataclass(node, cls, path)
    if isinstance(hint, type) and hint in _SCALARS:
        return _SCALARS[hint]

    def unsupported(d: Decoder, node: Node, path: str) -> object:
        raise TypeError(f"policy schema uses an unsupported type {hint!r} at {path}")

    return unsupported


@functools.cache
def _schema(
    cls: type[DataclassInstance],
) -> tuple[dict[str, Step], dict[str, dataclasses.Field[object]]]:
    """The decode step of each init field of a dataclass, and those fields, worked out once per
    class (``get_type_hints`` evaluates every annotation string again on each call: most of a
    10k-tenant load). Hints are read in their module's names and :data:`_HINT_NAMES`."""
    hints = get_type_hints(cls, localns=_HINT_NAMES, include_extras=True)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    return {name: _plan(hints[name]) for name in fields}, fields


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _keys(cls: type[DataclassInstance]) -> str:
    return ", ".join(f.name for f in dataclasses.fields(cls) if f.init)


def _is_null(node: Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _kind(node: Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _show(node)


def _show(node: Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        if node.tag == "tag:yaml.org,2002:null":
            return "nothing (null)"
        return repr(node.value)
    return _kind(node)
