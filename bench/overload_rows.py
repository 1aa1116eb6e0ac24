"""Every logical request of one arm at one level, attempt by attempt: what ``--rows`` writes
(one JSON line per request), for looking at what a percentile is made of.

A row: ``arm``, ``level``, ``request``, ``lane``, ``ttft_ms`` (first send to the first token of
the successful attempt, retries included; None if it never succeeded) and ``attempts``: for
each, ``sent`` (s from the level's start), ``status``, ``error`` (the body's code or the
client's reason), ``answered_ms`` / ``first_token_ms`` after its own send, ``retry_after`` told
and ``waited`` (the Retry-After it honoured before it was sent)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from overload_client import Attempt

__all__ = ["rows"]


def _ms(start: float, t: float | None) -> float | None:
    return None if t is None else round(1000.0 * (t - start), 1)


def rows(arm: str, level: str, attempts: Iterable[Attempt]) -> list[dict[str, Any]]:
    by_req: dict[int, list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_req[a.request].append(a)
    out = []
    for request, tries in sorted(by_req.items()):
        tries.sort(key=lambda a: a.number)
        last = tries[-1]
        ok = last.ok and last.first_token is not None
        out.append({
            "arm": arm, "level": level, "request": request, "lane": tries[0].lane,
            "ttft_ms": _ms(tries[0].sent, last.first_token) if ok else None,
            "attempts": [
                {
                    "sent": round(a.sent, 3), "status": a.status, "error": a.error,
                    "answered_ms": _ms(a.sent, a.answered),
                    "first_token_ms": _ms(a.sent, a.first_token),
                    "retry_after": a.retry_after, "waited": a.told_to_wait,
                }
                for a in tries
            ],
        })  # fmt: skip
    return out
