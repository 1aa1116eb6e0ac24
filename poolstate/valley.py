"""The batch runners' lines at a pool's replicas, as the degradation ladder reads them (pure).

A batch runner fills the running slots interactive traffic leaves idle (batch_service/pacer.py)
and yields them itself: its window shrinks with the first sample that shows interactive demand
rising, and on a pool that schedules by priority the replicas preempt its lines. Those lines
are not overload. The ladder's level is the pool's saturation, and the replicas count the
runner's lines in it like any request: a valley filled to the batch lane's share (0.9 of the
slots) read 0.9, and the example's ladder clamped the free tier's answers at 0.8 and sent it to
the fallback model at 1.0 while nothing but the batch was running. So every runner publishes
how many of its lines are at the replicas now, and the ladder takes their share of the pool's
slots off the saturation it reads (:func:`ladder_level`).

The online planner (controlplane/autoscale/) leaves them out too: a job fills whatever slots
it finds, so counted as demand its lines asked for replicas no interactive request needed
(and a replica added is more slots for the job to fill): batch in the valleys must not buy
GPUs. So a runner also publishes the
lines the pool has answered it since it started and their prompt and completion tokens
(cumulative, like the replicas' own counters), and the planner subtracts them from the pool's
arrivals and tokens.

**Where.** One Redis hash per pool (:func:`valley_key`), one field per runner replica (its
consumer name), the value ``"<lines> <wall-clock seconds> <answered> <prompt> <generated>"``
(:class:`RunnerWord`). A runner writes it every ``PUBLISH_EVERY_S`` while it feeds a job and
with 0 lines when it stops; the hash expires ``KEY_TTL_S`` after the last write. A reader takes
the fields written within ``MAX_AGE_S`` (:func:`fresh_words`): a runner that died stops
counting after that, and so does one whose clock is far off.

**The count.** A runner publishes its lines in flight less the share that is in the gateway
rather than at the replicas (:meth:`batch_service.pacer.Pacer.at_replicas`). It reaches a
reader up to half a second after it was true, the pool state's sample is up to as old: a
window opening or closing reads a little off for that moment (the lines fewer than they are,
a job's start read its lines as overload when the count lagged a second), and a runner only
opens its window while interactive demand leaves room. A reader that cannot read Redis counts
none: the level is then the plain saturation, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from policy.model import Policy

__all__ = [
    "KEY_TTL_S",
    "MAX_AGE_S",
    "PUBLISH_EVERY_S",
    "RunnerWord",
    "fresh_total",
    "fresh_words",
    "ladder_level",
    "runner_pool",
    "valley_key",
]

PUBLISH_EVERY_S = 0.25  # a runner's write, while it feeds a job (the pool state's scrape interval)
MAX_AGE_S = 2.0  # a field older than this counts nothing (a runner gone, or its clock off)
KEY_TTL_S = 10.0  # the hash disappears this long after its last write


def runner_pool(policy: Policy) -> str | None:
    """The pool the batch runners fill, where runners run (None: no batch section, no runner
    replicas, or a pool the policy does not have)."""
    b = policy.batch
    if b is None or b.runner.replicas <= 0 or b.pool not in policy.pools:
        return None
    return b.pool


def valley_key(pool: str) -> str:
    """The pool's hash of runner replica → its word (one cluster slot per pool)."""
    return f"tw:valley:{{{pool}}}"


@dataclass(frozen=True, slots=True)
class RunnerWord:
    """What one runner replica says of its lines on the pool."""

    lines: int  # at the pool's replicas now
    at: float  # when it said so (its wall clock, seconds)
    answered: int = 0  # lines the pool answered it since the runner started
    prompt: int = 0  # their prompt tokens
    generated: int = 0  # their completion tokens

    def encode(self) -> str:
        return (
            f"{max(0, self.lines)} {self.at:.3f} {max(0, self.answered)} "
            f"{max(0, self.prompt)} {max(0, self.generated)}"
        )

    @staticmethod
    def decode(value: bytes | str) -> RunnerWord | None:
        """None for a value that does not parse (or says something impossible)."""
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        parts = text.split()
        if len(parts) != 5:
            return None
        try:
            lines, at = int(parts[0]), float(parts[1])
            answered, prompt, generated = int(parts[2]), int(parts[3]), int(parts[4])
        except ValueError:
            return None
        if not math.isfinite(at) or min(lines, answered, prompt, generated) < 0:
            return None
        return RunnerWord(lines, at, answered, prompt, generated)


def fresh_words(fields: Mapping[bytes | str, bytes | str], now: float) -> dict[str, RunnerWord]:
    """Runner replica → its word, for the fields written within ``MAX_AGE_S`` of ``now`` (wall
    clock) that parse."""
    out: dict[str, RunnerWord] = {}
    for name, value in fields.items():
        word = RunnerWord.decode(value)
        if word is not None and abs(now - word.at) <= MAX_AGE_S:
            key = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
            out[key] = word
    return out


def fresh_total(fields: Mapping[bytes | str, bytes | str], now: float) -> int:
    """The lines at the replicas of every fresh field (:func:`fresh_words`)."""
    return sum(w.lines for w in fresh_words(fields, now).values())


def ladder_level(saturation: float, lines: int, capacity: int) -> float:
    """The pool's saturation without the runners' ``lines`` at its replicas: each line holds
    one of the pool's ``capacity`` running slots (its share of the mean replica saturation,
    ``running / max_running_requests``), at least 0. Unknown capacity (0) or no lines: the
    saturation itself."""
    if lines <= 0 or capacity <= 0:
        return saturation
    return max(0.0, saturation - lines / capacity)
