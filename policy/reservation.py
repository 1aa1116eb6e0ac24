"""``reservation``: how much of a tenant's token budget a request reserves, and what a request
gets when its whole answer does not fit (filters/plugins/tokens/plugin.py; docs/quotas.md
"Reservations that fit the answer").

The reservation is the prompt (counted exactly with the pool's tokenizer, else bounded from its
bytes) plus the output the request is likely to use: with ``output: learned``, the ``quantile``
of the completion tokens this tenant's requests for this model settled over the last
``window`` (two windows at most, at least ``min_samples`` answers; else the pooled lengths of
every tenant of the model; else ``max_tokens``), never above ``max_tokens``. ``output:
max_tokens`` reserves the ceiling, as before. The in-stream stop at a spent budget (the usage
plugin) keeps a reservation smaller than ``max_tokens`` from overshooting.

``short_budget``: ``reject`` (the default) leaves ``max_tokens`` alone: a request whose
reservation does not fit gets 429 with ``Retry-After`` from the rate-limit service, and an
admitted one may run to its own end. ``clamp`` lowers ``max_tokens`` to what the budget holds
after the prompt (the behaviour before issue 36: more requests admitted, many cut short with
``finish_reason: length``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from policy.decode import Duration, Range

__all__ = ["ReservationPolicy"]


@dataclass(frozen=True)
class ReservationPolicy:
    output: Literal["learned", "max_tokens"] = "learned"
    quantile: Annotated[float, Range(0.5, 0.999)] = 0.95
    window: Annotated[float, Duration(10, 7 * 86400)] = 600.0
    min_samples: Annotated[int, Range(1, 100_000)] = 20
    short_budget: Literal["reject", "clamp"] = "reject"
