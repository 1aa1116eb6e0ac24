"""Errors raised by ``prefixindex``.

Exception tree::

    PrefixIndexError
    ├── KvEventsConfigError  a ``--kv-events-config`` JSON document is not valid
    └── KvEventDecodeError   a ZMQ message is not an SGLang KV-event frame / batch
"""

from __future__ import annotations

__all__ = ["KvEventDecodeError", "KvEventsConfigError", "PrefixIndexError"]


class PrefixIndexError(Exception):
    """Base of every error raised by ``prefixindex``."""


class KvEventsConfigError(PrefixIndexError, ValueError):
    """The KV-events configuration is malformed (the message says which key and what is allowed)."""


class KvEventDecodeError(PrefixIndexError, ValueError):
    """A received message does not have SGLang's KV-event wire shape."""
