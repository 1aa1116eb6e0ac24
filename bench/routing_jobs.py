"""The jobs of the routing benchmarks (bench/routing.py live, bench/routing_sim.py in process),
and two bounds no router passes on them: one infinite cache, and one LRU radix cache the size of
the whole pool (the replicas' caches combined, requests one after another)."""

from __future__ import annotations

import random

from backends.emulator.radix_cache import RadixCache
from backends.emulator.tokenizer import encode, render_chat
from backends.emulator.trace import TraceRecord, ideal_cached_tokens, prompt_text

__all__ = ["Job", "combined_lru_hit_ratio", "docs_jobs", "session_jobs", "trace_jobs"]

Job = tuple[str, int]  # (prompt text, max tokens)


def trace_jobs(records: list[TraceRecord], scale: int) -> tuple[list[Job], float]:
    """The trace slice as jobs, and the hit ratio of one infinite cache on it."""
    ideal = ideal_cached_tokens(records, scale)
    ceiling = sum(c for _, c in ideal) / max(1, sum(p for p, _ in ideal))
    jobs = [(prompt_text(r, scale), max(1, r.output_length // scale)) for r in records]
    return jobs, ceiling


def docs_jobs(n: int, docs: int, words: int, seed: int) -> tuple[list[Job], float]:
    """Agents over shared long documents: each request is one of ``docs`` documents (Zipf-like
    popularity) followed by its own question; the infinite-cache ceiling counts each document's
    words once."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(docs)]
    texts = [" ".join(f"doc{d}w{i}" for i in range(words)) for d in range(docs)]
    jobs: list[Job] = []
    seen: set[int] = set()
    cached = total = 0
    for i in range(n):
        d = rng.choices(range(docs), weights)[0]
        question = " ".join(f"q{i}w{j}" for j in range(rng.randint(20, 80)))
        jobs.append((f"{texts[d]} {question}", rng.randint(16, 128)))
        total += words + 80
        cached += words if d in seen else 0
        seen.add(d)
    return jobs, cached / total


def session_jobs(n: int, sessions: int, seed: int) -> tuple[list[Job], float]:
    """Agent sessions (a workload the picker's defaults were not tuned on, issue 37): each of
    ``sessions`` sessions runs one of four agents (its system prompt of 300-1,500 words, shared
    by every session of that agent) and grows turn by turn with a tool's output (50-1,200
    words) and a user message; the sessions' turns interleave (a session starts when another
    ends, eight at a time), so each turn's prompt is its session's previous prompt plus the new
    text. The infinite-cache ceiling counts each prompt's longest prefix seen before."""
    rng = random.Random(seed)
    agents = [" ".join(f"agent{a}sys{i}" for i in range(rng.randint(300, 1500))) for a in range(4)]
    live: list[tuple[int, str, int]] = []  # (session id, prompt so far, turns left)
    started = 0
    jobs: list[Job] = []
    cached = total = 0

    def new() -> tuple[int, str, int]:
        nonlocal started
        started += 1
        return started, rng.choice(agents), rng.randint(2, max(2, 2 * n // sessions))

    while len(jobs) < n:
        while len(live) < 8:
            live.append(new())
        k = rng.randrange(len(live))
        sid, text, left = live[k]
        tool = " ".join(f"s{sid}t{len(jobs)}w{j}" for j in range(rng.randint(50, 1200)))
        user = " ".join(f"s{sid}u{len(jobs)}w{j}" for j in range(rng.randint(10, 60)))
        prompt = f"{text} {tool} {user}"
        total += len(prompt.split())
        cached += len(text.split())  # its session's previous prompt (or the agent's prompt)
        jobs.append((prompt, rng.randint(16, 200)))
        if left <= 1:
            live.pop(k)
        else:
            live[k] = (sid, prompt, left - 1)
    return jobs, cached / max(1, total)


def combined_lru_hit_ratio(jobs: list[Job], capacity_tokens: int) -> float:
    """Hit ratio of one radix cache of ``capacity_tokens`` (LRU eviction) serving ``jobs`` one
    at a time as the emulator renders them (chat template; the last token always computed)."""
    cache = RadixCache(capacity_tokens)
    cached = total = 0
    for text, _ in jobs:
        ids = encode(render_chat([{"role": "user", "content": text}]))
        match = cache.match_prefix(ids[:-1])
        cache.lock(match.node)
        uncached = len(ids) - match.length
        if not cache.allocate(uncached):
            cache.unlock(match.node)
            continue
        cache.release(uncached)
        cache.insert(ids)
        cache.unlock(match.node)
        cached += match.length
        total += len(ids)
    return cached / max(1, total)
