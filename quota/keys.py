"""Redis key names. Every key of one subject (a tenant, or a service + client address) carries the
same hash tag ``{…}`` so one Lua call touches one Redis Cluster slot. See docs/quotas.md.

    tw:{<tenant>}:quota                     live quota fields (HSET/HGET; wins over the policy)
    tw:{<tenant>}:seed                      the policy defaults last copied into :quota
    tw:{<tenant>}:b:<quota>                 token bucket state (hash: tk, ts)
    tw:{<tenant>}:w:<quota>:<unit>:<index>  window counter (integer), expires after the window
    tw:{<tenant>}:r:<request id>            reservation record (hash), expires after the TTL
    tw:{svc:<service>:<client>}:…           the same for request-count limits of services
    tw:{svc:<service>}:quota                live request-limit fields of a service
"""

from __future__ import annotations

__all__ = [
    "bucket_key",
    "config_key",
    "record_key",
    "seed_key",
    "service_subject",
    "subject_tag",
    "window_key",
]

_BAD = str.maketrans({"{": "_", "}": "_", " ": "_"})


def subject_tag(subject: str) -> str:
    """``tw:{subject}`` with braces removed from the subject so the hash tag stays intact."""
    return "tw:{" + subject.translate(_BAD) + "}"


def service_subject(service: str, client: str | None = None) -> str:
    return f"svc:{service}" if client is None else f"svc:{service}:{client}"


def config_key(subject: str) -> str:
    return subject_tag(subject) + ":quota"


def seed_key(subject: str) -> str:
    return subject_tag(subject) + ":seed"


def bucket_key(subject: str, quota: str) -> str:
    return f"{subject_tag(subject)}:b:{quota}"


def window_key(subject: str, quota: str, unit: str, index: int) -> str:
    return f"{subject_tag(subject)}:w:{quota}:{unit}:{index}"


def record_key(subject: str, request_id: str) -> str:
    return f"{subject_tag(subject)}:r:{request_id}"
