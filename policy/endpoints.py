"""The endpoints file: one ``host:port`` per line, ``#`` starts a comment.

Other tools (the SGLang launcher, an autoscaler) rewrite it atomically; the control plane
watches it and pushes the new endpoint set.
"""

from __future__ import annotations

from policy.model import Address

__all__ = ["format_endpoints", "parse_endpoints_text"]


def parse_endpoints_text(text: str) -> tuple[tuple[Address, ...], list[tuple[int, str]]]:
    """Parse an endpoints file; return the endpoints and ``(line, problem)`` pairs."""
    out: list[Address] = []
    problems: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            out.append(Address.parse(line))
        except ValueError as exc:
            problems.append((number, str(exc)))
    return tuple(dict.fromkeys(out)), problems


def format_endpoints(endpoints: list[Address] | tuple[Address, ...]) -> str:
    return "".join(f"{ep}\n" for ep in endpoints)
