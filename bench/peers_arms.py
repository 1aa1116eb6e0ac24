"""The arms of the gateway comparison (bench/peers.py), all in front of the same emulators.

- ``direct``: no gateway (the client spreads requests over the replicas): the latency baseline.
- ``envoy``: plain Envoy, round robin, no governance (``overload_arms.plain_envoy_bootstrap``).
- ``tokenweir``: ``tokenweir up`` on a policy written here: identity, lane, tokens (the prompt's
  bound, the learned answer length), prefix affinity, token quotas reserved in Redis, usage
  settlement; the budget bursts' route (header ``x-peers-budget: 1``) stops streams at the
  budget (the usage plugin's ``stop_at_budget``), where learned reservations apply.
- ``litellm``: the LiteLLM proxy (``litellm[proxy]``, in its own virtual environment, see
  ``peers_litellm``) with per-key TPM limits from a custom auth module, counters in Redis.
- ``sglang-router``: PyPI ``sglang-router`` (round robin); its own admission is global (a request
  bucket and a concurrency cap), so each budget burst starts another instance set to the budget.

The budget bursts' history (``PeerArm.warmup_target``): tokenweir learns its tenants' answer
lengths, so the history goes to the burst's key and the key's bucket is refilled after it
(``DEL tw:{tenant}:b:tokens``, docs/quotas.md): the burst starts on a full budget with the
history learned. The peers learn nothing from a history (LiteLLM reserves by ``max_tokens``,
sglang-router counts requests), so theirs goes to an unlimited key (LiteLLM) or to the main
router (sglang-router): the same requests, and the same full budget at the burst.

Every arm starts fresh, owns its children (``runtime.children.Child``) and stops them in
``aclose``; the emulators belong to ``Emulators`` and outlive the arms.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import redis.asyncio as aioredis
import yaml
from overload_arms import plain_envoy_bootstrap
from peers_litellm import LITELLM_ENV, litellm_command, write_litellm_config
from peers_workload import tenant_keys
from prometheus_client.parser import text_string_to_metric_families

from runtime.children import Child, checkout, wait_child_line, wait_child_port
from runtime.ports import free_port
from tokenweir.envoy_launcher import envoy_binary

__all__ = ["ARMS", "BUDGET_HEADER", "MODEL", "BudgetSpec", "Emulators", "PeerArm", "make_arm"]

ARMS = (
    "direct",
    "envoy",
    "tokenweir",
    "litellm",
    "sglang-router",
    "tokenweir-python-meter",
    "tokenweir-baseline",
    "tokenweir-median",
)
MODEL = "llama-3.1-8b"
BUDGET_HEADER = ("x-peers-budget", "1")  # sent by the budget bursts (tokenweir's budget route)
WARMUP_KEY = "tw-peers-warmup"  # no limit: the peers' history (they learn nothing from it)


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    burst: int  # tokens
    refill_per_second: float  # tokens/s (burst / 60: a per-minute budget)
    mean_request_tokens: float  # for sglang-router, whose bucket counts requests


Budgets = dict[str, BudgetSpec]  # API key -> its budget (one fresh key per burst)


@dataclass
class Emulators:
    """The SGLang emulators every arm sends to (started once per run)."""

    replicas: int
    run_dir: Path
    time_scale: float
    running: int
    tokenizer_path: Path | None = None  # a model directory: prompts counted by its tokenizer
    stop_prob: float = 0.0  # per-token EOS chance (for requests without ignore_eos)
    ports: list[int] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    async def start(self) -> None:
        for i in range(self.replicas):
            port = free_port()
            argv = [
                sys.executable, "-m", "backends.emulator", "--host", "127.0.0.1",
                "--port", str(port), "--model", MODEL, "--profile", "llama-3.1-8b-h100",
                "--time-scale", str(self.time_scale), "--max-running-requests", str(self.running),
                "--stop-prob", str(self.stop_prob), "--seed", str(i), "--log-level", "WARNING",
                *(["--tokenizer-path", str(self.tokenizer_path)] if self.tokenizer_path else []),
            ]  # fmt: skip
            child = Child(f"emulator#{i}", argv, self.run_dir / f"emulator-{i}.log")
            child.start()
            self.children.append(child)
            self.ports.append(port)
        for port, child in zip(self.ports, self.children, strict=True):
            await wait_child_port("127.0.0.1", port, child)

    def pids(self) -> list[int]:
        return [c.pid for c in self.children if c.pid is not None]

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.children))


class PeerArm:
    """One gateway in front of the shared emulators."""

    name = ""
    limits_tokens = False  # has a per-key token limit

    def __init__(self, emus: Emulators, run_dir: Path, budgets: Budgets) -> None:
        self.emus = emus
        self.run_dir = run_dir
        self.budgets = budgets
        self.port = free_port()
        self.children: list[Child] = []

    @property
    def urls(self) -> list[str]:
        """Chat-completion URLs; a client spreads its requests over them in turn."""
        return [f"http://127.0.0.1:{self.port}/v1/chat/completions"]

    def pids(self) -> list[int]:
        return [c.pid for c in self.children if c.pid is not None]

    async def start(self) -> None:
        raise NotImplementedError

    async def budget_urls(self, key: str) -> list[str]:
        """Where the burst on ``key`` sends (the same gateway unless the arm needs its own)."""
        return self.urls

    def warmup_target(self, key: str) -> tuple[list[str], str]:
        """Where and with which key the history before the burst on ``key`` goes: the peers
        learn nothing from it, so an unlimited key keeps their budget whole for the burst."""
        return self.urls, WARMUP_KEY

    async def restore_budget(self, key: str) -> None:
        """Refill ``key``'s budget after its history (only where the history used it)."""
        return None

    async def false_rejects(self, key: str) -> float | None:
        """The gateway's count of 429s that would have fit (None: it has none)."""
        return None

    async def gateway_counters(self) -> dict[str, float]:
        """Counters of the gateway's own that explain a burst (empty: none read)."""
        return {}

    async def aclose(self) -> None:
        for child in reversed(self.children):
            await child.aclose(3.0)
        self.children.clear()

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Child:
        child = Child(name, argv, self.run_dir / f"{name}.log", env=env or {}, cwd=cwd)
        child.start()
        self.children.append(child)
        return child


class Direct(PeerArm):
    name = "direct"

    @property
    def urls(self) -> list[str]:
        return [u + "/v1/chat/completions" for u in self.emus.urls]

    async def start(self) -> None:
        return None


class PlainEnvoy(PeerArm):
    name = "envoy"

    async def start(self) -> None:
        path = self.run_dir / "envoy-plain.json"
        path.write_text(json.dumps(plain_envoy_bootstrap(self.port, self.emus.ports), indent=1))
        base_id = 1000 + zlib.crc32(str(path).encode()) % 60000
        child = self._spawn(
            "envoy-plain",
            [str(envoy_binary()), "-c", str(path), "--base-id", str(base_id),
             "--concurrency", "1", "--log-level", "warning"],
        )  # fmt: skip
        await wait_child_port("127.0.0.1", self.port, child)


class Tokenweir(PeerArm):
    name = "tokenweir"
    limits_tokens = True
    usage_meter = "envoy"  # the Lua usage meter; "python": every response chunk via ext_proc
    src: Path | None = None  # another checkout's code (the baseline arm)
    reservation: ClassVar[dict[str, Any] | None] = None  # the policy's ``reservation`` section

    def __init__(self, emus: Emulators, run_dir: Path, budgets: Budgets, redis_port: int) -> None:
        super().__init__(emus, run_dir, budgets)
        self.redis_port = redis_port  # the benchmark's Redis (the arm's quotas, histograms)
        self.rls_metrics_port = free_port()

    async def start(self) -> None:
        path = self.run_dir / f"{self.name}-policy.yaml"
        path.write_text(yaml.safe_dump(tokenweir_policy(self), sort_keys=False))
        async with self._redis() as r:
            await (
                r.flushdb()
            )  # a fresh start: no quotas, buckets or answer lengths of an arm before
        argv = [
            str(Path(sys.executable).parent / "tokenweir"), "--log-level", "warning", "up",
            "--no-prometheus",  # a scraper beside the arm would take CPU from what is measured
            "-c", str(path), "--run-dir", str(self.run_dir / f"{self.name}-up"),
            "--drain-timeout", "1", "--redis-url", f"redis://127.0.0.1:{self.redis_port}/0",
        ]  # fmt: skip
        child = self._spawn(f"{self.name}-up", argv, *checkout(self.src))
        await wait_child_port("127.0.0.1", self.port, child, timeout=120)
        await wait_child_line(child, "tokenweir up: ready", timeout=90)

    def _redis(self) -> aioredis.Redis:
        return aioredis.Redis(host="127.0.0.1", port=self.redis_port)

    def warmup_target(self, key: str) -> tuple[list[str], str]:
        return self.urls, key  # the history is learned on the burst's own key

    async def restore_budget(self, key: str) -> None:
        async with self._redis() as r:
            await r.delete(f"tw:{{{key.removeprefix('tw-peers-')}}}:b:tokens")

    async def false_rejects(self, key: str) -> float | None:
        """``tokenweir_ratelimit_false_rejects_total`` of the key's tenant (0 before any)."""
        url = f"http://127.0.0.1:{self.rls_metrics_port}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            page = await resp.text()
        return false_rejects_of(page, key.removeprefix("tw-peers-"))

    async def gateway_counters(self) -> dict[str, float]:
        """Envoy's rate-limit and ext_proc counters (``/stats``), summed over their prefixes:
        ``ratelimit.error`` and ``ratelimit.failure_mode_allowed`` count requests admitted
        without a decision (the service did not answer within ``ratelimit.timeout``)."""
        log = (self.run_dir / f"{self.name}-up.log").read_text(errors="replace")
        m = re.search(r"admin (http://[0-9.:]+)", log)
        if m is None:
            return {}
        async with aiohttp.ClientSession() as http, http.get(m.group(1) + "/stats") as resp:
            return envoy_counters(await resp.text())


def envoy_counters(page: str) -> dict[str, float]:
    """The rate-limit filter's decisions (``ratelimit.ok`` / ``over_limit`` / ``error`` /
    ``failure_mode_allowed``) and the ``ext_proc.<name>`` counters of an Envoy ``/stats`` page,
    each summed over the prefixes (clusters, listeners) it appears under."""
    out: dict[str, float] = {}
    for line in page.splitlines():
        name, _, value = line.partition(": ")
        if not value.strip().isdigit():
            continue
        head, _, last = name.rpartition(".")
        if head.endswith(".ratelimit") and last in _RATELIMIT_DECISIONS:
            key = f"ratelimit.{last}"
        elif ".ext_proc." in name:
            key = "ext_proc." + name.rsplit(".ext_proc.", 1)[1]
        else:
            continue
        out[key] = out.get(key, 0.0) + float(value)
    return out


# the rate-limit filter's decisions (not the service cluster's upstream_* counters)
_RATELIMIT_DECISIONS = ("ok", "over_limit", "error", "failure_mode_allowed")


def false_rejects_of(page: str, tenant: str) -> float:
    """The tenant's false-reject count on a rate-limit service's /metrics page."""
    return sum(
        s.value
        for fam in text_string_to_metric_families(page)
        for s in fam.samples
        if s.name == "tokenweir_ratelimit_false_rejects_total" and s.labels.get("tenant") == tenant
    )


def tokenweir_policy(arm: PeerArm) -> dict[str, Any]:
    """The full governance path: every tier's quota far above the traffic, the budget tenants
    at ``burst`` tokens refilled at ``refill_per_second``."""
    big = {"tokens": {"burst": 1_000_000_000, "refill_per_second": 100_000_000}}
    tiers: dict[str, Any] = {
        t: {"lane": lane, "max_tokens": 4096, "quotas": big}
        for t, lane in (("free", "batch"), ("pro", "interactive"), ("enterprise", "interactive"))
    }
    tiers["budget"] = {"lane": "interactive", "max_tokens": 4096, "quotas": big}
    tenants: dict[str, Any] = {
        key.removeprefix("tw-peers-"): {"tier": tier, "api_keys": [key]}
        for tier, keys in tenant_keys().items()
        for key in keys
    }
    tenants[WARMUP_KEY.removeprefix("tw-peers-")] = {"tier": "pro", "api_keys": [WARMUP_KEY]}
    for key, b in arm.budgets.items():
        tenants[key.removeprefix("tw-peers-")] = {
            "tier": "budget",
            "api_keys": [key],
            "quotas": {"tokens": {"burst": b.burst, "refill_per_second": b.refill_per_second}},
        }
    reservation = getattr(arm, "reservation", None)
    plugins: list[Any] = ["identity", "lane", "tokens", "prefix", "usage"]
    route: dict[str, Any] = {
        "pool": "chat",
        "rate_limit": {"enabled": True},
        "filters": {"plugins": plugins, "usage_meter": getattr(arm, "usage_meter", "envoy")},
    }
    # the budget bursts: streams stopped at the budget, so reservations are the learned lengths
    stop = {"name": "usage", "settings": {"stop_at_budget": True}}
    budget_route = {
        **route,
        "name": "budget",
        "match": {"prefix": "/v1/", "headers": {BUDGET_HEADER[0]: BUDGET_HEADER[1]}},
        "filters": {"plugins": [*plugins[:-1], stop]},
    }
    return {
        "version": 1,
        "control_plane": {
            "xds": f"127.0.0.1:{free_port()}",
            "metrics": f"127.0.0.1:{free_port()}",
            "drain_timeout": "1s",
        },
        "ratelimit": {
            "address": f"127.0.0.1:{free_port()}",
            "metrics_port": getattr(arm, "rls_metrics_port", None) or free_port(),
            "timeout": "200ms",
        },
        "filters": {
            "address": f"127.0.0.1:{free_port()}",
            "metrics_port": free_port(),
            "message_timeout": "500ms",
        },
        "pools": {
            "chat": {
                "models": [MODEL],
                "endpoints": [f"127.0.0.1:{p}" for p in arm.emus.ports],
                "affinity": {
                    "headers": ["x-session-id", "x-prefix-hash"],
                    "hash_balance_factor": 150,
                    "prefix_tokens": 256,
                },
                "health_check": {"path": "/health", "interval": "5s", "timeout": "2s"},
                "retries": {"enabled": False},
                "timeouts": {"connect": "1s", "request": "0s", "stream_idle": "120s"},
            }
        },
        "gateways": {
            "edge": {
                "listen": f"127.0.0.1:{arm.port}",
                "routes": [budget_route, {**route, "name": "chat", "match": {"prefix": "/v1/"}}],
            }
        },
        "tiers": tiers,
        **({"reservation": reservation} if reservation else {}),
        "tenants": tenants,
    }


class Litellm(PeerArm):
    name = "litellm"
    limits_tokens = True

    def __init__(self, emus: Emulators, run_dir: Path, budgets: Budgets, redis_port: int) -> None:
        super().__init__(emus, run_dir, budgets)
        self.redis_port = redis_port

    async def start(self) -> None:
        limits = {key: b.burst for key, b in self.budgets.items()}
        cfg = write_litellm_config(
            self.run_dir / "litellm", MODEL, self.emus.urls, self.redis_port, limits
        )
        child = self._spawn("litellm", litellm_command(cfg, self.port), env=LITELLM_ENV)
        await wait_child_port("127.0.0.1", self.port, child, timeout=180)


class SglangRouter(PeerArm):
    name = "sglang-router"
    limits_tokens = False  # a global bucket of requests, not a per-key token budget

    def _argv(self, port: int, concurrent: int, rate: float, queue: int) -> list[str]:
        return [
            sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(port), "--worker-urls", *self.emus.urls, "--policy", "round_robin",
            "--max-concurrent-requests", str(concurrent), "--queue-size", str(queue),
            "--queue-timeout-secs", "60", "--rate-limit-tokens-per-second", str(rate),
            "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
            "--log-level", "error",
        ]  # fmt: skip

    async def start(self) -> None:
        child = self._spawn("sglang-router", self._argv(self.port, 100_000, 100_000, 0))
        await wait_child_port("127.0.0.1", self.port, child, timeout=60)

    _budget_router: Child | None = None

    async def budget_urls(self, key: str) -> list[str]:
        """Another router (the previous burst's stopped) whose bucket holds the key's budget in
        requests of the burst's mean size, refilled at the budget's rate, no queue (excess
        answered 429 at once)."""
        b = self.budgets[key]
        if self._budget_router is not None:
            await self._budget_router.aclose(3.0)
            self.children.remove(self._budget_router)
        port = free_port()
        slots = max(1, round(b.burst / b.mean_request_tokens))
        rate = max(1, round(b.refill_per_second / b.mean_request_tokens))
        child = self._spawn(f"sglang-router-{key}", self._argv(port, slots, rate, 0))
        self._budget_router = child
        await wait_child_port("127.0.0.1", port, child, timeout=60)
        return [f"http://127.0.0.1:{port}/v1/chat/completions"]


class TokenweirPythonMeter(Tokenweir):
    """tokenweir with ``usage_meter: python`` (before Envoy's Lua meter): not in the default
    run; ``--arms tokenweir tokenweir-python-meter`` measures the two side by side."""

    name = "tokenweir-python-meter"
    usage_meter = "python"


class TokenweirMedian(Tokenweir):
    """tokenweir reserving the median of its tenants' answers (``reservation.quantile: 0.5``)
    instead of p95: more of a budget admitted at once, more answers stopped at the budget."""

    name = "tokenweir-median"
    reservation: ClassVar[dict[str, Any] | None] = {"quantile": 0.5}


class TokenweirBaseline(Tokenweir):
    """tokenweir run from another checkout's code (``--baseline-src``, e.g. a ``git archive``
    of an older commit): ``--arms tokenweir-baseline tokenweir`` measures old and new side by
    side on the same emulators."""

    name = "tokenweir-baseline"

    def __init__(
        self, emus: Emulators, run_dir: Path, budgets: Budgets, redis_port: int, src: Path
    ) -> None:
        super().__init__(emus, run_dir, budgets, redis_port)
        self.src = src


def make_arm(
    name: str,
    emus: Emulators,
    run_dir: Path,
    budgets: Budgets,
    redis_port: int,
    baseline_src: Path | None = None,
) -> PeerArm:
    if name == "litellm":
        return Litellm(emus, run_dir, budgets, redis_port)
    if name == "tokenweir-baseline":
        if baseline_src is None:
            raise ValueError("the tokenweir-baseline arm needs --baseline-src")
        return TokenweirBaseline(emus, run_dir, budgets, redis_port, baseline_src)
    tokenweirs: dict[str, type[Tokenweir]] = {
        "tokenweir": Tokenweir,
        "tokenweir-python-meter": TokenweirPythonMeter,
        "tokenweir-median": TokenweirMedian,
    }
    if name in tokenweirs:
        return tokenweirs[name](emus, run_dir, budgets, redis_port)
    kinds: dict[str, type[PeerArm]] = {
        "direct": Direct,
        "envoy": PlainEnvoy,
        "sglang-router": SglangRouter,
    }
    return kinds[name](emus, run_dir, budgets)
