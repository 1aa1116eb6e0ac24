"""Errors of the endpoint picker.

PickerError
└── PickerConfigError   a pool's routing settings cannot be served (no endpoints, ...)
"""

from __future__ import annotations

__all__ = ["PickerConfigError", "PickerError"]


class PickerError(Exception):
    """Base of the picker's errors."""


class PickerConfigError(PickerError):
    """A pool's routing settings cannot be served."""
