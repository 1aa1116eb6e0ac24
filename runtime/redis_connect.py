"""Connecting to Redis or Redis Cluster (detected with INFO cluster, or forced by ``?cluster=1``):
the rate-limit service and the control plane's dashboard share it."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

__all__ = ["connect_redis"]

log = logging.getLogger(__name__)


def _split_cluster_flag(url: str) -> tuple[str, bool | None]:
    """The URL without its ``cluster`` query flag, and the flag (None when absent). A URL
    without the flag is returned as it is: rebuilding ``unix:///path`` through urlunsplit
    drops the empty authority (``unix:/path``), which redis-py 8 refuses."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if "cluster" not in query:
        return url, None
    flag = query.pop("cluster")[0]
    rest = "&".join(f"{k}={v}" for k, vs in query.items() for v in vs)
    clean = f"{parts.scheme}://{parts.netloc}{parts.path}"
    clean += (f"?{rest}" if rest else "") + (f"#{parts.fragment}" if parts.fragment else "")
    return clean, flag.lower() in ("1", "true", "yes")


async def connect_redis(url: str, *, timeout: float = 0.5) -> Any:
    """An asyncio client (``Redis`` or ``RedisCluster``); never fails when Redis is down: the
    standalone client reconnects by itself on the next command."""
    clean, forced = _split_cluster_flag(url)
    opts: dict[str, Any] = {"socket_connect_timeout": timeout, "socket_timeout": timeout * 2}
    if forced is None:
        probe = aioredis.Redis.from_url(clean, **opts)
        try:
            info = await probe.info("cluster")
            forced = bool(int(info.get("cluster_enabled", 0)))
        except (RedisError, OSError) as exc:
            log.warning(
                "redis at %s does not answer (%s); assuming it is not a cluster", clean, exc
            )
            forced = False
        finally:
            await probe.aclose()
    if forced:
        return RedisCluster.from_url(clean, **opts)
    return aioredis.Redis.from_url(clean, health_check_interval=0, **opts)
