"""Connecting to Redis or Redis Cluster (detected with INFO cluster, or forced by ``?cluster=1``):
the rate-limit service and the control plane's dashboard share it.

Credentials and TLS are the URL's: ``redis://USER:PASSWORD@host:port/0`` (Redis ACL), and
``rediss://…?ssl_ca_certs=CA&ssl_certfile=CRT&ssl_keyfile=KEY`` for TLS (redis-py reads those
query arguments). Refused credentials are a :class:`RedisAuthError` at start-up
(:func:`verify_credentials`), not a stream of failed requests; a URL is logged without its
password (:func:`redacted`)."""

from __future__ import annotations

import logging
from typing import TypedDict
from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AuthenticationError, RedisError, ResponseError

__all__ = [
    "LazyRedis",
    "RedisAuthError",
    "connect_redis",
    "redacted",
    "split_cluster_flag",
    "verify_credentials",
]


class RedisAuthError(Exception):
    """Redis refused the URL's user or password (or wants one the URL does not give)."""


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return url.replace(parts.netloc, f"{user}:***@{host}", 1)


def _auth_refused(exc: BaseException) -> bool:
    if isinstance(exc, AuthenticationError):
        return True
    text = str(exc)
    return isinstance(exc, ResponseError) and text.startswith(("NOAUTH", "WRONGPASS", "NOPERM"))


async def verify_credentials(url: str, *, timeout: float = 2.0) -> None:
    """One PING: raise :class:`RedisAuthError` when Redis refuses the credentials; a Redis that
    does not answer is left to the caller's outage handling (it may come up later)."""
    clean, _ = _split_cluster_flag(url)
    probe = aioredis.Redis.from_url(clean, socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        await probe.ping()
    except RedisError as exc:
        if _auth_refused(exc):
            raise RedisAuthError(
                f"redis at {redacted(clean)} refused the credentials ({exc}); give the ACL "
                "user and password in the URL: redis://USER:PASSWORD@host:port/0"
            ) from exc
        log.warning("redis at %s does not answer yet: %s", redacted(clean), exc)
    except OSError as exc:
        log.warning("redis at %s does not answer yet: %s", redacted(clean), exc)
    finally:
        await probe.aclose()


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


def split_cluster_flag(url: str) -> tuple[str, bool]:
    """The URL without ``?cluster=`` (its TLS arguments kept), and whether it forces a cluster."""
    clean, flag = _split_cluster_flag(url)
    return clean, bool(flag)


class _Timeouts(TypedDict):
    socket_connect_timeout: float
    socket_timeout: float


async def connect_redis(url: str, *, timeout: float = 0.5) -> aioredis.Redis | RedisCluster:
    """An asyncio client (``Redis`` or ``RedisCluster``); never fails when Redis is down: the
    standalone client reconnects by itself on the next command."""
    clean, forced = _split_cluster_flag(url)
    opts: _Timeouts = {"socket_connect_timeout": timeout, "socket_timeout": timeout * 2}
    await verify_credentials(url, timeout=max(timeout, 1.0))
    if forced is None:
        probe = aioredis.Redis.from_url(clean, **opts)
        try:
            info = await probe.info("cluster")
            forced = bool(int(info.get("cluster_enabled", 0)))
        except (RedisError, OSError) as exc:
            log.warning(
                "redis at %s does not answer (%s); assuming it is not a cluster",
                redacted(clean),
                exc,
            )
            forced = False
        finally:
            await probe.aclose()
    if forced:
        return RedisCluster.from_url(clean, **opts)
    return aioredis.Redis.from_url(clean, health_check_interval=0, **opts)


class LazyRedis:
    """A client connected at the first call and kept (:func:`connect_redis`), for a background
    reader whose Redis comes with the policy: :meth:`use` a URL (None: no Redis; a new one
    drops the old client). A call while Redis refuses the credentials raises
    :class:`RedisAuthError` (so do the next ones, until the URL changes)."""

    def __init__(self, url: str | None = None, *, timeout: float = 1.0) -> None:
        self._url = url
        self._timeout = timeout
        self._client: aioredis.Redis | RedisCluster | None = None
        self._old: list[aioredis.Redis | RedisCluster] = []

    @property
    def url(self) -> str | None:
        return self._url

    def use(self, url: str | None) -> None:
        if url != self._url:
            self._url = url
            if self._client is not None:
                self._old.append(self._client)
                self._client = None

    async def __call__(self) -> aioredis.Redis | RedisCluster | None:
        while self._old:
            await self._old.pop().aclose()
        if self._url is None:
            return None
        if self._client is None:
            self._client = await connect_redis(self._url, timeout=self._timeout)
        return self._client

    async def aclose(self) -> None:
        self.use(None)
        while self._old:
            await self._old.pop().aclose()
