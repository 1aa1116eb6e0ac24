"""The filter server's Redis client: a bounded pool whose callers WAIT for a free connection.

redis-py's default asyncio pool raises ``MaxConnectionsError("Too many connections")`` as soon as
more commands are in flight than it has connections (100): under a burst of 300 requests the
key lookups failed although Redis was healthy. Here ``BlockingConnectionPool`` queues a command
until a connection is free (at most ``pool_wait`` seconds; the caller's own deadline is usually
shorter), so a burst costs waiting, never errors, and Redis never sees more than
``max_connections`` connections from one process.
"""

from __future__ import annotations

import redis.asyncio as aioredis

__all__ = ["DEFAULT_MAX_CONNECTIONS", "redis_client"]

DEFAULT_MAX_CONNECTIONS = 16


def redis_client(
    url: str,
    *,
    timeout: float,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    pool_wait: float = 5.0,
) -> aioredis.Redis:
    """An asyncio ``Redis`` over a ``BlockingConnectionPool`` it owns (``aclose()`` closes it).
    ``timeout`` bounds connecting and each socket read."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_wait,
        socket_connect_timeout=timeout,
        socket_timeout=max(timeout, 1.0),
    )
    return aioredis.Redis.from_pool(pool)
