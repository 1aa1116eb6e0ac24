"""Errors of the idempotency package.

::

    FiltersError (filters.errors)
    └── StoreUnavailable     the answer store (Redis) failed or is too slow

A replay, a 409 or a 422 is not an error: :class:`filters.plugins.idempotency.record.Decision` is a value.
"""

from __future__ import annotations

from filters.errors import FiltersError

__all__ = ["StoreUnavailable"]


class StoreUnavailable(FiltersError):
    """The store of idempotent answers cannot be reached in time."""
