"""What one call of the picker's mapper worker costs the filter server: the mapper's worker over
its pipes (:mod:`filters.plugins.picker.worker`, now) against a one-worker ``ProcessPoolExecutor``
(before), side by side, rounds interleaved.

    .venv/bin/python bench/mapper_call.py [--calls 400] [--rounds 5] [--words 600]

Per call, medians over rounds: the CPU time of the thread that runs the event loop
(``time.thread_time``), of the whole filter-side process (loop + the executor's helper threads:
``time.process_time``), and the wall time of the call, on uvloop as in the filter server. A call maps one new prompt of ``--words``
words (the mapper's usual call on a busy box carries one to a few prompts). Writes
``bench/results/mapper_call.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

from filters.plugins.picker.mapper import ROOT, Job, map_batch  # noqa: E402
from filters.plugins.picker.prompt import checkpoints  # noqa: E402
from filters.plugins.picker.worker import MapperWorker  # noqa: E402

STEP, PAGE, EVERY = 256, 16, 16


def job(i: int, words: int) -> Job:
    data = " ".join(f"p{i}w{k}" for k in range(words)).encode()
    marks = checkpoints(data, STEP)
    return (marks, data[: len(marks) * STEP], ROOT, 0, len(marks), 0)


async def timed(call, jobs: list[list[Job]]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    for j in jobs:
        await call(j)
    n = len(jobs)
    return {
        "loop_thread_us": 1e6 * (time.thread_time() - c0) / n,
        "process_us": 1e6 * (time.process_time() - p0) / n,
        "wall_us": 1e6 * (time.perf_counter() - t0) / n,
    }


async def main(calls: int, rounds: int, words: int) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    worker = MapperWorker()

    async def by_executor(j: list[Job]) -> object:
        return await loop.run_in_executor(pool, map_batch, j, STEP, PAGE, EVERY)

    async def by_pipes(j: list[Job]) -> object:
        return await worker.call(j, STEP, PAGE, EVERY)

    arms = {"executor (before)": by_executor, "pipes (now)": by_pipes}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    try:
        for call in arms.values():  # warm: start each worker, import the mapper
            await call([job(0, words)])
        for r in range(rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for name in order:
                jobs = [[job(r * calls + i, words)] for i in range(calls)]
                results[name].append(await timed(arms[name], jobs))
    finally:
        pool.shutdown()
        await worker.aclose()
    out: dict[str, object] = {"calls": calls, "rounds": rounds, "words": words}
    for name, rows in results.items():
        out[name] = {k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--words", type=int, default=600)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "mapper_call.json")
    a = ap.parse_args()
    import uvloop  # the filter server's loop (runtime/process.py)

    res = uvloop.run(main(a.calls, a.rounds, a.words))
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
