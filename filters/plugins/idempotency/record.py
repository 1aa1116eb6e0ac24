"""What is stored per idempotency key, and the pure decision for a new request.

A key's entry is ``inflight`` (a request is running with it), ``done`` (its answer: status,
content type and body) or ``unstored`` (it finished, but the answer was larger than the store
allows). An ``inflight`` entry names the backend request it runs as (``rid``, the SGLang request
id the plugin gave it: what an abort names). Each entry
carries the fingerprint of the request that made it; a request with the
same key and another fingerprint is a misuse (422). The Redis key holds the tenant as a hash
tag, so one tenant's key can never name another tenant's answer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Decision",
    "Entry",
    "State",
    "decide",
    "decode_entry",
    "encode_entry",
    "fingerprint",
    "parse_key",
    "store_key",
]

State = Literal["inflight", "done", "unstored"]
Verdict = Literal["run", "replay", "in_flight", "take_over", "mismatch", "unstored"]
_MAX_META = 4096


@dataclass(frozen=True, slots=True)
class Entry:
    state: State
    fingerprint: str
    owner: str
    status: int = 0
    content_type: str = ""
    tokens: int = 0  # backend tokens the answer cost (prompt + completion), for the metric
    body: bytes = b""
    rid: str = ""  # inflight: the backend request id it runs as ("" : none given)


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    entry: Entry | None = None


def fingerprint(method: str, path: str, body: bytes) -> str:
    """SHA-256 over the method, the path and the body exactly as the client sent them."""
    h = hashlib.sha256()
    h.update(method.upper().encode())
    h.update(b"\0")
    h.update(path.encode())
    h.update(b"\0")
    h.update(body)
    return h.hexdigest()


def store_key(tenant: str, key: str) -> str:
    """``tw:idem:{tenant}:<sha256 of the key>`` (the client's key is never stored as such)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:40]
    return f"tw:idem:{{{tenant}}}:{digest}"


def parse_key(raw: str, max_length: int) -> str | None:
    """The key from the header: an sf-string (``"abc"``) or a bare token of visible ASCII.
    None when it is empty, too long or has characters the draft does not allow."""
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if not value or len(value) > max_length:
        return None
    if any(not (0x20 < ord(c) < 0x7F) or c in '"\\' for c in value):
        return None
    return value


def encode_entry(entry: Entry) -> bytes:
    meta = {
        "s": entry.state,
        "fp": entry.fingerprint,
        "o": entry.owner,
        "st": entry.status,
        "ct": entry.content_type,
        "t": entry.tokens,
    }
    if entry.rid:
        meta["r"] = entry.rid
    return json.dumps(meta, separators=(",", ":")).encode() + b"\n" + entry.body


def decode_entry(raw: bytes) -> Entry | None:
    """None for bytes this code did not write (they are treated as absent)."""
    head, sep, body = raw.partition(b"\n")
    if not sep or len(head) > _MAX_META:
        return None
    try:
        meta = json.loads(head)
        state = meta["s"]
        if state not in ("inflight", "done", "unstored"):
            return None
        return Entry(
            state=state,
            fingerprint=str(meta["fp"]),
            owner=str(meta["o"]),
            status=int(meta["st"]),
            content_type=str(meta["ct"]),
            tokens=int(meta["t"]),
            body=body,
            rid=str(meta.get("r", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None


def decide(existing: Entry | None, fp: str, holder_alive: bool = True) -> Decision:
    """What a request with fingerprint ``fp`` gets, given the entry its key already has
    (None: the claim succeeded, the request runs) and whether the holder of an ``inflight``
    entry still renews its lease. A dead holder's request is taken over (its backend request
    aborted first) when the entry names that backend request; without a ``rid`` nothing can
    abort it, and the claim holds until ``inflight_ttl``."""
    if existing is None:
        return Decision("run")
    if existing.fingerprint != fp:
        return Decision("mismatch", existing)
    if existing.state == "inflight":
        if not holder_alive and existing.rid:
            return Decision("take_over", existing)
        return Decision("in_flight", existing)
    if existing.state == "unstored":
        return Decision("unstored", existing)
    return Decision("replay", existing)
