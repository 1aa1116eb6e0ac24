"""Idempotency keys: a retried request never runs the model twice nor is charged twice."""

from filters.plugins.idempotency.plugin import IdempotencyPlugin
from filters.plugins.idempotency.store import MemoryStore, RedisStore

__all__ = ["IdempotencyPlugin", "MemoryStore", "RedisStore"]
