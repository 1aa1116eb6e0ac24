"""How a replica says it orders its queue (SGLang's priority scheduling), and whether that is
what its pool declares (``pools.NAME.priority_scheduling``). Pure.

The gateway trusts ``priority_scheduling: {enabled: true}``: it writes each lane's priority into
request bodies and admits the interactive lane past the slots batch holds, expecting the
replicas to preempt batch. A replica started without ``--enable-priority-scheduling`` (or with
another threshold, the other order, or preemption disabled) would make interactive requests
queue behind batch inside the replica instead. The control plane reads these server
arguments from ``/get_server_info`` and publishes them per replica (:class:`Ranking`); the
filter server falls back to non-preemptive admission for a pool where an answering replica
differs (:func:`pool_mismatch`). A replica that does not say (an older SGLang, no server info
yet) is trusted: the policy's word stands until a replica contradicts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from poolstate.errors import PoolStateDecodeError
from wire.jsontypes import JsonObject

__all__ = ["Declared", "Ranking", "pool_mismatch", "replica_mismatch"]


class Declared(Protocol):
    """What the pool declares (``policy.scheduling.PriorityScheduling``)."""

    @property
    def enabled(self) -> bool: ...
    @property
    def preemption_threshold(self) -> int: ...
    @property
    def low_values_first(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Ranking:
    """A replica's priority-scheduling server arguments; None: it did not say."""

    enabled: bool | None = None  # --enable-priority-scheduling
    preemption_threshold: int | None = None  # --priority-scheduling-preemption-threshold
    low_values_first: bool | None = None  # --schedule-low-priority-values-first
    preempts: bool | None = None  # not --disable-priority-preemption (newer SGLang)

    @property
    def known(self) -> bool:
        return bool(self.to_json())

    def to_json(self) -> JsonObject:
        """The known values only (``on``, ``thr``, ``low``, ``pre``)."""
        pairs = (
            ("on", self.enabled),
            ("thr", self.preemption_threshold),
            ("low", self.low_values_first),
            ("pre", self.preempts),
        )
        return {k: v for k, v in pairs if v is not None}

    @classmethod
    def from_json(cls, d: object) -> Ranking:
        if not isinstance(d, Mapping):
            raise PoolStateDecodeError(f"rank: expected an object, got {type(d).__name__}")

        def flag(key: str) -> bool | None:
            v = d.get(key)
            if v is not None and not isinstance(v, bool):
                raise PoolStateDecodeError(f"rank.{key}: expected true or false, got {v!r}")
            return v

        thr = d.get("thr")
        if thr is not None and (isinstance(thr, bool) or not isinstance(thr, int)):
            raise PoolStateDecodeError(f"rank.thr: expected an integer, got {thr!r}")
        return cls(flag("on"), thr, flag("low"), flag("pre"))


def replica_mismatch(have: Ranking, want: Declared) -> str | None:
    """Pure: how ``have`` differs from a pool that declares priority scheduling ``want``, in
    SGLang's flags; None when it matches, does not say, or ``want`` is not enabled (a replica
    that ranks requests which all carry the default priority changes nothing)."""
    if not want.enabled:
        return None
    if have.enabled is False:
        return "runs without --enable-priority-scheduling"
    out = []
    if have.preempts is False:
        out.append("runs with --disable-priority-preemption")
    thr = have.preemption_threshold
    if thr is not None and thr != want.preemption_threshold:
        out.append(
            f"has --priority-scheduling-preemption-threshold {thr}, "
            f"the policy {want.preemption_threshold}"
        )
    low = have.low_values_first
    if low is not None and low != want.low_values_first:
        out.append(
            "runs with --schedule-low-priority-values-first, the policy ranks high values first"
            if low
            else "ranks high values first, the policy says low_values_first"
        )
    return "; ".join(out) or None


class _Replica(Protocol):
    @property
    def ranking(self) -> Ranking: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def stale(self) -> bool: ...


def pool_mismatch(replicas: Mapping[str, _Replica], want: Declared) -> str | None:
    """Pure: why the pool's answering replicas (last scrape answered, fresh) do not schedule as
    ``want`` declares — ``"ENDPOINT: what differs"`` for the first such replica by endpoint and
    how many more — or None when each matches or does not say."""
    bad = []
    for ep, r in sorted(replicas.items()):
        why = replica_mismatch(r.ranking, want) if r.healthy and not r.stale else None
        if why is not None:
            bad.append(f"{ep}: {why}")
    if not bad:
        return None
    more = f" (and {len(bad) - 1} more replicas)" if len(bad) > 1 else ""
    return bad[0] + more
