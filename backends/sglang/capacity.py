"""Capacity hints from a server's ``/get_server_info`` (real SGLang or the emulator).

SGLang reports server arguments at the top level and scheduler facts (``max_total_num_tokens``,
``max_running_requests``) either at the top level (older versions) or in ``internal_states[0]``
(newer). ``parse_server_info`` reads both; the control plane can make limits follow the server.
It also reads how the server orders its queue (``enable_priority_scheduling``,
``priority_scheduling_preemption_threshold``, ``schedule_low_priority_values_first``,
``disable_priority_preemption``: :class:`~poolstate.ranking.Ranking`); a field the
server does not report stays None (unknown), never false.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from backends.errors import LauncherError
from backends.sglang.endpoints import file_lock, write_atomic
from poolstate.ranking import Ranking
from wire.jsontypes import JsonObject

__all__ = ["CapacityHints", "fetch_capacity", "parse_server_info", "write_capacity_file"]


@dataclass(frozen=True, slots=True)
class CapacityHints:
    max_total_tokens: int | None
    max_running_requests: int | None
    max_queued_requests: int | None
    chunked_prefill_size: int | None
    context_length: int | None
    page_size: int | None
    # where the server publishes its KV-cache events: {"endpoint": .., "replay_endpoint": ..}
    kv_events: dict[str, str | None] | None = None
    ranking: Ranking = field(
        default_factory=Ranking
    )  # its priority scheduling (SGLang's server args)

    def to_json(self) -> JsonObject:
        out = asdict(self)
        if self.kv_events is None:
            out.pop("kv_events")
        if not self.ranking.known:
            out.pop("ranking")
        return out


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return int(value)


def parse_server_info(info: Mapping[str, object]) -> CapacityHints:
    """Pure: the hints in one ``/get_server_info`` answer (missing values are None)."""
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}

    def pick(*keys: str) -> int | None:
        for source in (state, info):
            for key in keys:
                value = _int(source.get(key))
                if value is not None:
                    return value
        return None

    return CapacityHints(
        max_total_tokens=pick("max_total_num_tokens", "max_total_tokens"),
        max_running_requests=pick("max_running_requests"),
        max_queued_requests=pick("max_queued_requests"),
        chunked_prefill_size=pick("chunked_prefill_size"),
        context_length=pick("context_length", "max_model_len"),
        page_size=pick("page_size"),
        ranking=_ranking(state, info),
    )


def _ranking(*sources: Mapping[str, object]) -> Ranking:
    def first(key: str) -> object:
        for source in sources:
            if source.get(key) is not None:
                return source[key]
        return None

    def flag(key: str) -> bool | None:
        v = first(key)
        return v if isinstance(v, bool) else None

    thr = first("priority_scheduling_preemption_threshold")
    no_preempt = flag("disable_priority_preemption")
    return Ranking(
        enabled=flag("enable_priority_scheduling"),
        preemption_threshold=thr if isinstance(thr, int) and not isinstance(thr, bool) else None,
        low_values_first=flag("schedule_low_priority_values_first"),
        preempts=None if no_preempt is None else not no_preempt,
    )


async def fetch_capacity(base_url: str, *, timeout_s: float = 10.0) -> CapacityHints:
    """GET ``/get_server_info`` (then ``/server_info``) and parse it."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    last: Exception | None = None
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for path in ("/get_server_info", "/server_info"):
            try:
                async with http.get(base_url.rstrip("/") + path) as r:
                    if r.status == 200:
                        return parse_server_info(await r.json())
                    last = LauncherError(f"{path}: HTTP {r.status}")
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                last = exc
    raise LauncherError(f"cannot read server info from {base_url}: {last}") from last


def write_capacity_file(path: Path, endpoint: str, hints: CapacityHints | None) -> None:
    """Record (or with None remove) ``endpoint``'s hints in a JSON map {endpoint: hints}."""
    with file_lock(path):
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        if hints is None:
            data.pop(endpoint, None)
        else:
            data[endpoint] = hints.to_json()
        write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
