"""Errors of the collapse package.

::

    FiltersError (filters.errors)
    └── CollapseError        the fan-out endpoint cannot start

A request that does not collapse is not an error: it simply runs on its own.
"""

from __future__ import annotations

from filters.errors import FiltersError

__all__ = ["CollapseError"]


class CollapseError(FiltersError):
    """Request collapsing cannot be set up."""
