"""The shape of a decoded JSON document, for code that reads bodies, policy files and answers.

``json.loads`` returns ``Any``; annotating what it returns as :data:`JsonValue` (or
:data:`JsonObject` once an ``isinstance(x, dict)`` check has passed) makes mypy ask for the
narrowing a hostile document needs (a list where a dict was expected, a string for a number).
Read-only parameters take ``Mapping[str, object]``: ``dict`` is invariant, so a
``dict[str, int]`` is not a ``JsonObject``.

Ground layer: imports nothing of ours (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from typing import TypeAlias

JsonScalar: TypeAlias = bool | int | float | str | None
JsonValue: TypeAlias = "JsonScalar | list[JsonValue] | dict[str, JsonValue]"
JsonObject: TypeAlias = "dict[str, JsonValue]"
JsonArray: TypeAlias = "list[JsonValue]"

__all__ = ["JsonArray", "JsonObject", "JsonScalar", "JsonValue"]
