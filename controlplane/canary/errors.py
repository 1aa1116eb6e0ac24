"""Errors of the canary watch.

::

    CanaryError              a sample could not be read (a metrics page is missing or bad)

A rollback is not an error: it is an event, logged and counted.
"""

from __future__ import annotations

__all__ = ["CanaryError"]


class CanaryError(Exception):
    """A canary sample cannot be taken."""
