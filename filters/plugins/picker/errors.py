"""Errors of the endpoint picker.

PickerError
├── PickerConfigError   a pool's routing settings cannot be served (no endpoints, ...)
└── MapperDown          the mapper's worker process could not answer a call
"""

from __future__ import annotations

__all__ = ["MapperDown", "PickerConfigError", "PickerError"]


class PickerError(Exception):
    """Base of the picker's errors."""


class PickerConfigError(PickerError):
    """A pool's routing settings cannot be served."""


class MapperDown(PickerError):
    """A call of the mapper could not be answered: its worker process died or timed out, or the
    mapping failed (in the worker or on the loop)."""
