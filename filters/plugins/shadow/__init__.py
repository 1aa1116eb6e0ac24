"""Shadow pairs: each sampled request's primary answer compared with its shadow pool's."""

from filters.plugins.shadow.book import Book, Pending
from filters.plugins.shadow.plugin import ShadowPlugin
from filters.plugins.shadow.recorder import ShadowRecorder

__all__ = ["Book", "Pending", "ShadowPlugin", "ShadowRecorder"]
