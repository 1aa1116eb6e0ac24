"""Errors of the policy package.

    PolicyError              one or more problems found in a policy (``.issues``)
    └── (no subclasses)      every problem is an ``Issue``: file, line, key path, message

An ``Issue`` prints as ``file:line: key.path: what is wrong and what is allowed``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Issue", "PolicyError"]


@dataclass(frozen=True, order=True)
class Issue:
    file: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line > 0 else self.file
        return f"{where}: {self.path or '<root>'}: {self.message}"


class PolicyError(Exception):
    """A policy that cannot be used; ``issues`` lists every problem found, in file order."""

    def __init__(self, issues: list[Issue]) -> None:
        self.issues = sorted(issues)
        super().__init__("\n".join(str(i) for i in self.issues))
