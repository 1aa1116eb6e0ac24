"""Errors of the filter server.

::

    FiltersError
    ├── ConfigError          a plugin name or its settings are wrong (found when a chain is built)
    ├── ClientError          the request is bad: answered with an OpenAI-style 4xx, never retried
    ├── KeyServiceUnavailable  Redis failed and nothing else knows the API key (503, retry)
    └── PluginError          a plugin failed; the route's failure mode decides what happens

Errors are mapped to HTTP answers in one place: :func:`filters.chain.error_reply`.
"""

from __future__ import annotations

__all__ = ["ClientError", "ConfigError", "FiltersError", "KeyServiceUnavailable", "PluginError"]


class FiltersError(Exception):
    """Base of every error raised by the filter server."""


class ConfigError(FiltersError):
    """A plugin reference or its settings cannot be used."""


class ClientError(FiltersError):
    """A request the client must fix: answered with ``status`` and an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        reason: str,
        param: str | None = None,
        error_type: str = "invalid_request_error",
        headers: tuple[tuple[str, str], ...] = (),
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason  # short metric label: "bad_json", "too_large", ...
        self.param = param
        self.error_type = error_type
        self.headers = headers
        self.code = code


class PluginError(FiltersError):
    """A plugin raised; ``plugin`` and ``phase`` say where."""

    def __init__(self, plugin: str, phase: str, cause: BaseException) -> None:
        super().__init__(f"plugin {plugin!r} failed in {phase}: {type(cause).__name__}: {cause}")
        self.plugin = plugin
        self.phase = phase
        self.cause = cause


class KeyServiceUnavailable(FiltersError):
    """Redis (the key store) failed and nothing else knows the key: answered 503, never 401."""
