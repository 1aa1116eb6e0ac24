"""The filter server's LoRA state across reloads: each pool's adapter affinity, corrected by what
the replicas report, and the adapter loads the gateway asks of them.

- **Reading the replicas**: at most every ``lora.refresh`` per pool (on a request's way, never
  waiting for it), one task reads each replica's SGLang ``/get_server_info``: the adapters in its
  slots (``resident_lora_adapters``, least recent first: the emulator's; a real SGLang reports
  none, and the model stays this process's own view) and those registered (``lora_paths`` as the
  emulator and SGLang report it at start, ``loaded_lora_adapters`` after loads). A replica that
  does not answer keeps its last report.
- **Loading**: a request placed on a replica known not to have its adapter registered waits for
  ``/load_lora_adapter {lora_name, lora_path}`` there first (so replicas need not register every
  adapter); a holder past ``lora.preload_at`` of its bound makes the replica the adapter would
  spread to load it ahead of demand (a task; the request does not wait).

Every call is a task of this hub or awaited by a request; ``aclose`` stops them and the session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from filters.plugins.lora.affinity import AdapterAffinity
from policy.lora import LoraAdapters
from runtime.throttled_log import ThrottledLog

__all__ = ["LOAD_S", "LoraHub", "LoraMetrics", "read_server_info"]

_log = logging.getLogger(__name__)
_CALL_S = 2.0  # a /get_server_info answer later than this is skipped (the next refresh retries)
LOAD_S = 30.0  # longest a load may take (SGLang reads the adapter's weights)


class LoraMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "tokenweir_lora_"
        self.loads = Counter(
            p + "loads", "adapter loads the gateway asked of replicas (/load_lora_adapter)",
            ["pool", "reason", "outcome"], registry=registry,
        )  # fmt: skip
        self.reads = Counter(
            p + "replica_reads", "reads of the replicas' adapters (/get_server_info)",
            ["pool", "outcome"], registry=registry,
        )  # fmt: skip


def _names(value: object) -> list[str]:
    """Adapter names from a server-info list: names, or SGLang's ``{lora_name: ...}`` objects."""
    out: list[str] = []
    if isinstance(value, list):
        for item in value:
            name = item.get("lora_name") if isinstance(item, dict) else item
            if isinstance(name, str):
                out.append(name)
    elif isinstance(value, dict):  # {name: path}
        out.extend(str(k) for k in value)
    return out


def read_server_info(info: Mapping[str, object]) -> tuple[list[str] | None, list[str]]:
    """(resident least recent first, registered) from a ``/get_server_info`` answer; resident
    None where the server does not say (SGLang's own: its slots stay this process's guess)."""
    slots = info.get("resident_lora_adapters")
    resident = _names(slots) if slots is not None else None
    loaded = info.get("loaded_lora_adapters")
    registered = _names(loaded) if loaded is not None else _names(info.get("lora_paths"))
    return resident, registered


class LoraHub:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock: Callable[[], float] = time.monotonic,
        offline: bool = False,
    ) -> None:
        self.metrics = LoraMetrics(registry)
        self.offline = offline  # no calls to the replicas (a chain built to check a policy)
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._affinity: dict[str, tuple[tuple[int, int], AdapterAffinity]] = {}
        self._read_at: dict[str, float] = {}
        self._loading: dict[tuple[str, str], asyncio.Task[bool]] = {}
        self._log = ThrottledLog(clock, 10.0, _log)

    def affinity(self, pool: str, lora: LoraAdapters) -> AdapterAffinity:
        """The pool's affinity (a new one when its slots or spread factor changed)."""
        key = (lora.slots, lora.spread_factor)
        entry = self._affinity.get(pool)
        if entry is None or entry[0] != key:
            entry = self._affinity[pool] = (key, AdapterAffinity(lora.slots, lora.spread_factor))
        return entry[1]

    # ---- the replicas' reports ----------------------------------------------------------
    def refresh(self, pool: str, lora: LoraAdapters, replicas: Sequence[str]) -> None:
        """Read the replicas' adapters in the background when the last read is ``refresh`` old."""
        if lora.refresh <= 0 or self.offline:
            return
        now = self._clock()
        if now - self._read_at.get(pool, float("-inf")) < lora.refresh:
            return
        self._read_at[pool] = now
        self._spawn(
            self._read(pool, self.affinity(pool, lora), list(replicas)), f"lora-read-{pool}"
        )

    async def read(self, pool: str, lora: LoraAdapters, replicas: Sequence[str]) -> None:
        """Read the replicas' adapters now (tests, and the background refresh)."""
        await self._read(pool, self.affinity(pool, lora), list(replicas))

    async def _read(self, pool: str, aff: AdapterAffinity, replicas: Iterable[str]) -> None:
        session = self._open()

        async def one(replica: str) -> None:
            try:
                async with session.get(
                    f"http://{replica}/get_server_info",
                    timeout=aiohttp.ClientTimeout(total=_CALL_S),
                ) as resp:
                    info = await resp.json(content_type=None) if resp.status == 200 else None
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                self.metrics.reads.labels(pool, "failed").inc()
                self._log.warning("lora: reading %s's adapters failed: %r", replica, exc)
                return
            if not isinstance(info, dict):
                self.metrics.reads.labels(pool, "failed").inc()
                return
            resident, registered = read_server_info(info)
            aff.observe(replica, resident, registered)
            self.metrics.reads.labels(pool, "ok").inc()

        await asyncio.gather(*(one(r) for r in replicas))

    # ---- loads ----------------------------------------------------------------------------
    async def ensure(self, pool: str, lora: LoraAdapters, replica: str, adapter: str) -> bool:
        """Load ``adapter`` on ``replica`` when it is known not to be registered there; True
        when it is (or may be: never reported) registered after."""
        aff = self.affinity(pool, lora)
        if aff.registered(replica, adapter) is not False or self.offline:
            return True
        return await self._load_once(pool, lora, aff, replica, adapter, "demand")

    def preload(self, pool: str, lora: LoraAdapters, replicas: Sequence[str], adapter: str) -> None:
        """Load ``adapter`` ahead of demand where it would spread next, when its holders are
        busy (``lora.preload_at``); the request does not wait."""
        if self.offline:
            return
        aff = self.affinity(pool, lora)
        target = aff.preload(adapter, replicas, lora.preload_at / 100.0)
        if target is None or (target, adapter) in self._loading:
            return
        self._spawn(
            self._preload(pool, lora, aff, target, adapter), f"lora-preload-{adapter}@{target}"
        )

    async def _preload(
        self, pool: str, lora: LoraAdapters, aff: AdapterAffinity, replica: str, adapter: str
    ) -> None:
        await self._load_once(pool, lora, aff, replica, adapter, "ahead")

    async def _load_once(
        self, pool: str, lora: LoraAdapters, aff: AdapterAffinity, replica: str, adapter: str,
        reason: str,
    ) -> bool:  # fmt: skip
        """One load per (replica, adapter) at a time: later callers wait for the same call."""
        key = (replica, adapter)
        task = self._loading.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._load(pool, lora, aff, replica, adapter, reason)
            )
            self._loading[key] = task
            task.add_done_callback(lambda _t: self._loading.pop(key, None))
        return await asyncio.shield(task)

    async def _load(
        self, pool: str, lora: LoraAdapters, aff: AdapterAffinity, replica: str, adapter: str,
        reason: str,
    ) -> bool:  # fmt: skip
        body = {"lora_name": adapter, "lora_path": lora.paths.get(adapter, adapter)}
        try:
            async with self._open().post(
                f"http://{replica}/load_lora_adapter", json=body,
                timeout=aiohttp.ClientTimeout(total=LOAD_S),
            ) as resp:  # fmt: skip
                status, text = resp.status, await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            status, text = 0, repr(exc)
        # SGLang answers 400 "... already exists" when another client loaded it meanwhile
        ok = status == 200 or (status == 400 and "already" in text)
        if ok:
            aff.registered_now(replica, adapter)
        else:
            self._log.warning("lora: loading %s on %s failed: %s %s", adapter, replica, status,
                              text[:200])  # fmt: skip
        self.metrics.loads.labels(pool, reason, "ok" if ok else "failed").inc()
        return ok

    # ---- lifecycle --------------------------------------------------------------------------
    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _spawn(self, coro: Coroutine[object, None, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self) -> None:
        """Until the reads and loads in flight are done (tests)."""
        while self._tasks or self._loading:
            await asyncio.gather(*self._tasks, *self._loading.values(), return_exceptions=True)

    async def aclose(self) -> None:
        tasks = [*self._tasks, *self._loading.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
