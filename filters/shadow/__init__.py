"""Shadow pairs: each sampled request's primary answer compared with its shadow pool's."""

from filters.shadow.book import Book, Pending
from filters.shadow.plugin import ShadowPlugin
from filters.shadow.recorder import ShadowRecorder

__all__ = ["Book", "Pending", "ShadowPlugin", "ShadowRecorder"]
