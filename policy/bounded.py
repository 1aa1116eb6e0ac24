"""Compose a YAML document with bounds checked *before* any object is built.

A policy file is untrusted input read by every long-running process. Before a single Python
object is made from it, this module bounds

- the file size (``Limits.max_bytes``),
- the nesting depth (``Limits.max_depth``; PyYAML's composer and our decoder recurse per level,
  so a 500-level document would end in ``RecursionError``),
- alias expansion (``Limits.alias_nodes`` plus ``Limits.alias_ratio`` × the nodes written: a
  "billion laughs" file of a few lines would otherwise expand to gigabytes wherever the decoder
  walks it, e.g. the free-form ``planner:`` and plugin ``settings``),
- explicit tags (only the plain YAML types; ``!!python/...`` and custom tags are refused).

The parse is one pass over PyYAML's event stream (libyaml's C parser when it is installed: it
keeps line numbers and is several times faster than the pure-Python one), composing nodes
iteratively: no recursion at any depth. Every refusal is a :class:`PolicyError` with
``file:line: key.path: what is wrong; what is allowed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

import yaml
from yaml.resolver import Resolver

from policy.errors import Issue, PolicyError

if TYPE_CHECKING:  # libyaml's marks (absent where PyYAML runs without libyaml)
    from yaml import _yaml

__all__ = ["DEFAULT_LIMITS", "Limits", "compose_bounded"]

_Parser = getattr(yaml, "CSafeLoader", None)  # libyaml: the C parser (keeps line numbers)
_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {None, "!", *(_CORE + t for t in ("str", "int", "float", "bool", "null"))}
_ALLOWED_TAGS |= {_CORE + "seq", _CORE + "map"}


@dataclass(frozen=True)
class Limits:
    """Bounds on one policy document (defaults fit 100k tenants with room to spare)."""

    max_bytes: int = 32 * 1024 * 1024
    max_depth: int = 64
    alias_nodes: int = 100_000  # nodes aliases may add, plus alias_ratio per node written
    alias_ratio: int = 10


DEFAULT_LIMITS = Limits()


@dataclass
class _Frame:
    node: yaml.Node
    path: str
    anchor: str | None
    mapping: bool
    size: int = 1  # nodes in this subtree, aliases expanded
    key: yaml.Node | None = None  # mappings: the key waiting for its value
    items: list[object] = field(default_factory=list)


def compose_bounded(text: str, filename: str, limits: Limits = DEFAULT_LIMITS) -> yaml.Node | None:
    """The document's root node (None for an empty document), or :class:`PolicyError`."""
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > limits.max_bytes else 0
    if size > limits.max_bytes:
        raise _fail(
            filename, 0, "", f"the file is {size} bytes; at most {limits.max_bytes} allowed"
        )
    return _Composer(text, filename, limits).run()


def _bad_character(text: str, exc: yaml.reader.ReaderError) -> tuple[int, str, str]:
    """``(line, path, message)`` for a character the YAML reader refuses (a control character):
    the reader reports only an offset (libyaml's in UTF-8 bytes), so the character is found
    again by the reader's own rule."""
    found = yaml.reader.Reader.NON_PRINTABLE.search(text)
    where = found.start() if found is not None else max(0, min(exc.position, len(text)))
    line = text.count("\n", 0, where) + 1
    column = where - (text.rfind("\n", 0, where) + 1) + 1
    char = text[where] if found is not None else str(exc.character)[:1] or "?"
    return (
        line,
        "",
        f"invalid YAML: character U+{ord(char):04X} at column {column} is not allowed (YAML "
        "allows tab, line breaks and printable characters); remove it, or write it as an "
        f'escape inside a double-quoted string ("\\u{ord(char):04x}")',
    )


def _fail(filename: str, line: int, path: str, message: str) -> PolicyError:
    return PolicyError([Issue(filename, line, path, message)])


class _Composer:
    def __init__(self, text: str, filename: str, limits: Limits) -> None:
        self.filename = filename
        self.limits = limits
        self.text = text
        self.parser = _Parser(text) if _Parser is not None else yaml.SafeLoader(text)
        self.resolver = Resolver()
        self.tags: dict[tuple[str, tuple[bool, bool]], str] = {}
        self.anchors: dict[str, tuple[yaml.Node, int]] = {}
        self.stack: list[_Frame] = []
        self.written = 0
        self.expanded = 0
        self.root: yaml.Node | None = None
        self.documents = 0

    def run(self) -> yaml.Node | None:
        try:
            while (event := self.parser.get_event()) is not None:
                self._event(event)
                if isinstance(event, yaml.StreamEndEvent):
                    break
        except yaml.reader.ReaderError as exc:  # a character YAML does not allow: at its line
            raise _fail(self.filename, *_bad_character(self.text, exc)) from exc
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 0
            problem = getattr(exc, "problem", None) or str(exc)
            if "nesting depth" in problem:  # libyaml's own bound (1000) met while scanning ahead
                raise _fail(self.filename, line, self._short_path(), self._deep()) from exc
            raise _fail(self.filename, line, "", f"invalid YAML: {problem}") from exc
        finally:
            dispose = getattr(self.parser, "dispose", None)
            if dispose is not None:
                dispose()
        return self.root

    # -- events ------------------------------------------------------------------------------
    def _event(self, ev: yaml.Event) -> None:
        kind = type(ev)
        if kind is yaml.ScalarEvent:
            self._scalar(ev)  # type: ignore[arg-type]  # type(ev) is checked just above; mypy does not narrow on 'type(x) is C'
        elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
            self._open(ev)  # type: ignore[arg-type]  # type(ev) is checked just above; mypy does not narrow on 'type(x) is C'
        elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
            self._close(ev)
        elif kind is yaml.AliasEvent:
            self._alias(ev)  # type: ignore[arg-type]  # type(ev) is checked just above; mypy does not narrow on 'type(x) is C'
        elif kind is yaml.DocumentStartEvent:
            self.documents += 1
            if self.documents > 1:
                self._error(ev, "", "a second YAML document ('---'); a policy is one document")

    def _scalar(self, ev: yaml.ScalarEvent) -> None:
        tag = ev.tag
        if tag is None or tag == "!":
            key = (ev.value, ev.implicit)
            tag = self.tags.get(key)
            if tag is None:
                tag = self.resolver.resolve(yaml.ScalarNode, ev.value, ev.implicit)
                if len(self.tags) < 4096:  # repeated values (tiers, limits) resolve once
                    self.tags[key] = tag
        elif tag not in _ALLOWED_TAGS:
            self._bad_tag(ev, tag)
        node = yaml.ScalarNode(tag, ev.value, _mark(ev.start_mark), _mark(ev.end_mark), ev.style)
        self.written += 1
        if ev.anchor is not None:
            self.anchors[ev.anchor] = (node, 1)
        stack = self.stack
        if not stack:
            self.root = node
            return
        top = stack[-1]
        top.size += 1
        if top.mapping:
            if top.key is None:
                top.key = node
            else:
                top.items.append((top.key, node))
                top.key = None
        else:
            top.items.append(node)

    def _open(self, ev: yaml.CollectionStartEvent) -> None:
        path = self._path_here()
        if len(self.stack) >= self.limits.max_depth:
            self._error(ev, self._short_path(), self._deep())
        if ev.tag not in _ALLOWED_TAGS:
            self._bad_tag(ev, ev.tag)
        seq = type(ev) is yaml.SequenceStartEvent
        tag = ev.tag if ev.tag not in (None, "!") else _CORE + ("seq" if seq else "map")
        cls = yaml.SequenceNode if seq else yaml.MappingNode
        node = cls(tag, [], _mark(ev.start_mark), None, flow_style=ev.flow_style)
        self.written += 1
        self.stack.append(_Frame(node, path, ev.anchor, not seq))

    def _close(self, ev: yaml.Event) -> None:
        frame = self.stack.pop()
        frame.node.end_mark = ev.end_mark
        frame.node.value = frame.items
        if frame.anchor is not None:
            self.anchors[frame.anchor] = (frame.node, frame.size)
        self._attach(frame.node, frame.size)

    def _alias(self, ev: yaml.AliasEvent) -> None:
        found = self.anchors.get(ev.anchor or "")
        if found is None:
            self._error(ev, self._path_here(), f"alias *{ev.anchor} names no anchor defined above")
        node, size = found
        self.expanded += size
        allowed = self.limits.alias_nodes + self.limits.alias_ratio * self.written
        if self.expanded > allowed:
            self._error(
                ev,
                self._path_here(),
                f"aliases expand to more than {allowed} nodes (a YAML alias bomb?); at most "
                f"{self.limits.alias_nodes} plus {self.limits.alias_ratio} per node written "
                "are allowed",
            )
        self._attach(node, size)

    def _attach(self, node: yaml.Node, size: int) -> None:
        if not self.stack:
            self.root = node
            return
        top = self.stack[-1]
        top.size += size
        if top.mapping:
            if top.key is None:
                top.key = node
                return
            top.items.append((top.key, node))
            top.key = None
        else:
            top.items.append(node)

    # -- helpers -----------------------------------------------------------------------------
    def _path_here(self) -> str:
        """The key path of the node about to be attached (``pools.chat.routes[2]``)."""
        if not self.stack:
            return ""
        top = self.stack[-1]
        if isinstance(top.node, yaml.MappingNode):
            if top.key is None:
                return top.path
            key = top.key.value if isinstance(top.key, yaml.ScalarNode) else "?"
            return f"{top.path}.{key}" if top.path else str(key)
        return f"{top.path}[{len(top.items)}]"

    def _short_path(self) -> str:
        path = self._path_here()
        return path if len(path) <= 80 else path[:80] + "..."

    def _deep(self) -> str:
        depth = self.limits.max_depth
        return f"nesting deeper than {depth} levels; at most {depth} are allowed"

    def _bad_tag(self, ev: yaml.Event, tag: str | None) -> NoReturn:
        self._error(
            ev,
            self._path_here(),
            f"YAML tag {tag!r} is not allowed; write plain strings, numbers, booleans, "
            "lists and mappings",
        )

    def _error(self, ev: yaml.Event, path: str, message: str) -> NoReturn:
        mark = ev.start_mark
        raise _fail(self.filename, mark.line + 1 if mark is not None else 0, path, message)


def _mark(mark: yaml.Mark | _yaml.Mark | None) -> yaml.Mark | None:
    """libyaml's marks and PyYAML's have the same ``name``/``line``/``column`` that a node's
    readers use; the stubs type nodes with PyYAML's only, so libyaml's is passed on as it is
    (converting each, or even a ``cast`` call, costs a large load's time: two per node)."""
    return mark  # type: ignore[return-value]  # a libyaml Mark serves where PyYAML's is typed
