"""One lane's configuration (the policy's ``admission.lanes`` entry as admission reads it).

Its own module so that the admission state (:mod:`filters.plugins.admission.core`) and what is
predicted from it (:mod:`filters.plugins.admission.predict`) both read it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LaneConfig"]


@dataclass(frozen=True, slots=True)
class LaneConfig:
    name: str
    max_queue: int
    max_queue_per_tenant: int
    max_wait: float
    max_share: float = 1.0
    leave_for_higher: float | None = None  # headroom over the higher lanes' demand; None: off
