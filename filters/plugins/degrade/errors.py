"""Errors of the ladder package.

::

    FiltersError (filters.errors)
    └── LadderError          the ladder cannot be set up (a bad plugin setting)

A request degraded or shed is not an error: :class:`poolstate.ladder.Effect` is a value.
"""

from __future__ import annotations

from filters.errors import FiltersError

__all__ = ["LadderError"]


class LadderError(FiltersError):
    """The ladder cannot be set up as asked."""
