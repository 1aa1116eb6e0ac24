"""Errors of the admission package.

::

    FiltersError (filters.errors)
    └── AdmissionError       admission cannot be set up (bad settings, a pool it does not know)

A request that is shed is not an error: :class:`filters.plugins.admission.core.Shed` is a value, turned
into an HTTP answer in one place (:func:`filters.plugins.admission.replies.shed_reply`).
"""

from __future__ import annotations

from filters.errors import FiltersError

__all__ = ["AdmissionError"]


class AdmissionError(FiltersError):
    """Admission cannot be set up as asked."""
