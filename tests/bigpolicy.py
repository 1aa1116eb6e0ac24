"""A large valid policy (many tenants, many routes) for reload tests and ``bench/reload_bench.py``."""

from __future__ import annotations

__all__ = ["big_policy_text"]


def big_policy_text(
    *,
    tenants: int,
    routes: int,
    ports: dict[str, int],
    backend: tuple[str, int] = ("127.0.0.1", 30001),
    emulated: bool = False,
    rl_timeout: str = "50ms",
    message_timeout: str = "200ms",
    redis_url: str | None = None,
    generation: int = 0,
) -> str:
    """Policy YAML with ``tenants`` tenants (one API key each: ``tw-key-<i:07d>``) and ``routes`` routes
    on one gateway (route ``r<i>`` matches header ``x-route: r<i>``, the last one any ``/v1/``). ``ports`` names ``xds``, ``cp_metrics``, ``listen``, ``ratelimit``,
    ``rl_metrics``, ``filters``, ``filters_metrics``. ``generation`` changes every tenant's quota
    (a reload that touches everything). ``emulated``: ``tokenweir up`` runs one SGLang emulator
    on ``backend``'s port."""
    pool = (
        f"    emulated: {{replicas: 1, base_port: {backend[1]}, time_scale: 0.01}}"
        if emulated
        else f"    endpoints: [{backend[0]}:{backend[1]}]"
    )
    redis = f"  redis_url: {redis_url}\n" if redis_url else ""
    out = [
        "version: 1",
        "control_plane:",
        f"  xds: 127.0.0.1:{ports['xds']}",
        f"  metrics: 127.0.0.1:{ports['cp_metrics']}",
        "  debounce: 50ms",
        "ratelimit:",
        f"  address: 127.0.0.1:{ports['ratelimit']}",
        f"  metrics_port: {ports['rl_metrics']}",
        f"  timeout: {rl_timeout}",
        redis.rstrip("\n"),
        "filters:",
        f"  address: 127.0.0.1:{ports['filters']}",
        f"  metrics_port: {ports['filters_metrics']}",
        f"  message_timeout: {message_timeout}",
        "pools:",
        "  chat:",
        "    models: [llama-3.1-8b]",
        pool,
        "    timeouts: {connect: 1s, request: 30s}",
        "gateways:",
        "  edge:",
        f"    listen: 127.0.0.1:{ports['listen']}",
        "    routes:",
    ]
    for r in range(routes - 1):
        out += [
            f"      - name: r{r}",
            f"        match: {{prefix: /v1/, headers: {{x-route: r{r}}}}}",
            "        pool: chat",
            "        rate_limit: {enabled: true}",
            "        filters: {plugins: [identity, tokens, usage]}",
        ]
    out += [
        "      - name: chat",
        "        match: {prefix: /v1/}",
        "        pool: chat",
        "        rate_limit: {enabled: true}",
        "        filters: {plugins: [identity, tokens, usage]}",
        "tiers:",
        "  std:",
        "    max_tokens: 512",
        "    quotas:",
        "      requests: {burst: 100000, refill_per_second: 100000}",
        "tenants:",
    ]
    burst = 1_000_000 + generation
    for i in range(tenants):
        out.append(
            f"  t{i}: {{tier: std, api_keys: [tw-key-{i:07d}], "
            f"quotas: {{tokens: {{burst: {burst}, refill_per_second: 100000}}}}}}"
        )
    return "\n".join(line for line in out if line) + "\n"
