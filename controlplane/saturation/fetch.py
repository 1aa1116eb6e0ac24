"""HTTP reads of one replica: ``/metrics`` every round, ``/get_server_info`` once.

:class:`HttpFetcher` keeps one aiohttp session (connection reuse: a scrape every 250 ms to 30
replicas must not open 120 connections a second) and converts every client error to
:class:`ScrapeError` once, here; a host name that does not resolve to :class:`NameNotFound`.
Resolved names are cached for ``_DNS_TTL_S`` only: a pod that comes back has a new address.
"""

from __future__ import annotations

from typing import Protocol

import aiohttp

from controlplane.saturation.errors import NameNotFound, ScrapeError
from wire.jsontypes import JsonObject, JsonValue

__all__ = ["Fetcher", "HttpFetcher"]

_DNS_TTL_S = 5  # CoreDNS answers cluster names with a 5 s TTL by default


class Fetcher(Protocol):
    async def metrics(self, endpoint: str, timeout_s: float) -> str: ...
    async def server_info(self, endpoint: str, timeout_s: float) -> JsonObject: ...
    async def aclose(self) -> None: ...


class HttpFetcher:
    """``http://host:port`` reads over one pooled session."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=_DNS_TTL_S)
            )
        return self._session

    async def _get(self, url: str, timeout_s: float) -> aiohttp.ClientResponse:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        return await self._http().get(url, timeout=timeout)

    async def metrics(self, endpoint: str, timeout_s: float, path: str = "/metrics") -> str:
        """The text at ``path`` (an Envoy's ``/stats/prometheus?…`` for the dashboard)."""
        try:
            async with await self._get(f"http://{endpoint}{path}", timeout_s) as r:
                if r.status != 200:
                    raise ScrapeError(f"{endpoint}{path}: HTTP {r.status}")
                return await r.text()
        except aiohttp.ClientConnectorDNSError as exc:
            raise NameNotFound(f"{endpoint}{path}: {exc!r}") from exc
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
            raise ScrapeError(f"{endpoint}{path}: {exc!r}") from exc

    async def server_info(self, endpoint: str, timeout_s: float) -> JsonObject:
        """The replica's server info (a JSON object), from SGLang's newer or older path."""
        last = ""
        for path in ("/get_server_info", "/server_info"):
            try:
                async with await self._get(f"http://{endpoint}{path}", timeout_s) as r:
                    if r.status == 200:
                        info: JsonValue = await r.json(content_type=None)
                        if isinstance(info, dict):
                            return info
                    last = f"HTTP {r.status}"
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                last = repr(exc)
        raise ScrapeError(f"{endpoint}: no server info ({last})")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
