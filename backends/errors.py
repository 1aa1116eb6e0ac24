"""Errors raised by ``backends``.

Exception tree::

    BackendError
    ├── UnknownProfileError (also KeyError)   an unknown profile name
    ├── RequestError                           a request the server rejects with 400
    ├── SchedulerAbortError                    the scheduler refused the request (503, SGLang's
    │   │                                      AbortReq; e.g. a priority while priority is off)
    │   └── QueueFullError                     the waiting queue is full (503, as SGLang)
    ├── ServerClosingError                     the server is stopping or starting (503)
    ├── InjectedFaultError                     an error injected on purpose (500)
    ├── KvTransferError                        PD mode: the KV hand-over between a prefill and a
    │                                          decode server failed (500, as SGLang's decode)
    └── LauncherError                          the real-SGLang launcher failed
        └── LaunchTimeoutError                 /health did not come up in time
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "InjectedFaultError",
    "KvTransferError",
    "LaunchTimeoutError",
    "LauncherError",
    "QueueFullError",
    "RequestError",
    "SchedulerAbortError",
    "ServerClosingError",
    "UnknownProfileError",
]


class BackendError(Exception):
    """Base of every error raised by ``backends``."""


class UnknownProfileError(BackendError, KeyError):
    """No profile has this name; the message lists the known names."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = list(known)
        super().__init__(f"unknown backend profile {name!r}; known profiles: {', '.join(known)}")

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return str(self.args[0])


class RequestError(BackendError):
    """A bad request: the HTTP layer answers 400 with SGLang's error body."""

    def __init__(self, message: str, param: str | None = None) -> None:
        self.message = message
        self.param = param
        super().__init__(message)


class SchedulerAbortError(BackendError):
    """The scheduler refused the request with SGLang's message (HTTP 503)."""


class QueueFullError(SchedulerAbortError):
    """The scheduler's waiting queue is at ``max_queued_requests``."""


class ServerClosingError(BackendError):
    """The emulator is shutting down and takes no new work."""


class InjectedFaultError(BackendError):
    """Fault injection chose to fail this request."""


class KvTransferError(BackendError):
    """PD disaggregation: the prefill side of a request failed, timed out or could not be
    reached, or its decode side never came (SGLang's decode aborts such a request with 500)."""


class LauncherError(BackendError):
    """Starting or stopping a real SGLang server failed."""


class LaunchTimeoutError(LauncherError):
    """The launched server did not report healthy in time."""
