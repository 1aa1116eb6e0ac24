"""Typed reads of a plugin's settings (a route's ``filters.plugins[].settings``, a mapping of
what the policy file holds): each read returns the type the plugin needs or raises
:class:`~filters.errors.ConfigError` naming the plugin, the key, what is allowed and what was
given. Numbers written as strings (``"4096"``) read as numbers, as ``int()`` and ``float()`` read
them."""

from __future__ import annotations

from collections.abc import Mapping

from filters.errors import ConfigError

__all__ = ["float_setting", "int_setting", "optional_int_setting", "optional_str_setting",
           "strings_setting"]  # fmt: skip


def _bad(plugin: str, key: str, allowed: str, value: object) -> ConfigError:
    return ConfigError(f"{plugin}: {key} must be {allowed}, got {value!r}")


def optional_int_setting(settings: Mapping[str, object], plugin: str, key: str) -> int | None:
    """The integer under ``key``, or None where it is absent or null."""
    value = settings.get(key)
    if value is None:
        return None
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return int(value)
        except ValueError:
            pass
    raise _bad(plugin, key, "an integer", value)


def int_setting(settings: Mapping[str, object], plugin: str, key: str, default: int) -> int:
    """The integer under ``key``, ``default`` where it is absent or null."""
    value = optional_int_setting(settings, plugin, key)
    return default if value is None else value


def float_setting(settings: Mapping[str, object], plugin: str, key: str, default: float) -> float:
    """The number under ``key``, ``default`` where it is absent or null."""
    value = settings.get(key)
    if value is None:
        return default
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    raise _bad(plugin, key, "a number", value)


def optional_str_setting(settings: Mapping[str, object], plugin: str, key: str) -> str | None:
    """The string under ``key``, or None where it is absent or null."""
    value = settings.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _bad(plugin, key, "a string", value)


def strings_setting(settings: Mapping[str, object], plugin: str, key: str) -> frozenset[str]:
    """The list of strings under ``key`` (empty where it is absent or null)."""
    value = settings.get(key)
    if value is None:
        return frozenset()
    if isinstance(value, list | tuple | set | frozenset) and all(isinstance(v, str) for v in value):
        return frozenset(str(v) for v in value)
    raise _bad(plugin, key, "a list of strings", value)
