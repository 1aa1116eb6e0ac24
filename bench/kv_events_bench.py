"""The KV-event subscriber's CPU per batch, this tree against an older one, in one run.

A filter server on the picker route follows every replica's KV events on its own event loop, so
what the subscriber spends per batch is taken from requests. Here the subscriber runs alone in a
child process on uvloop, as in the filter server (``KvEventSubscriber`` + ``PrefixIndex`` as the picker builds them for an emulated
pool: page size 1, anchors every 16 tokens) following ``--replicas`` publishers that this process
plays: a real ZMQ XPUB and ROUTER replay socket each on ``ipc://``, batches shaped like the
emulator's (one ``BlockStored`` of ``--hashes`` blocks; the documents workload averages ~155).
The child's CPU (user + system, from ``getrusage``) while it applies ``rate x seconds`` batches
is divided by the batches. Sides alternate, order swapped every round; medians of the rounds.

``.venv/bin/python bench/kv_events_bench.py --baseline-src DIR [--rates 500 2000] [--rounds 5]``
(DIR: a source tree of older code, e.g. ``git archive <commit> | tar -x -C DIR``). Results:
``bench/results/kv_events_bench.json`` and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefixindex.wire import (  # noqa: E402
    END_SEQ,
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    decode_seq,
    encode_batch,
    encode_seq,
)

CHILD = """
import asyncio, json, resource, sys, time
from prefixindex.index import PrefixIndex
from prefixindex.subscriber import KvEventSubscriber, ReplicaFeed

async def main(where, n, expect, timeout):
    index = PrefixIndex(1, anchor_every=16, stale_after_s=600.0)
    feeds = [ReplicaFeed(f"r{i}", f"ipc://{where}/r{i}.pub", f"ipc://{where}/r{i}.replay")
             for i in range(n)]
    sub = KvEventSubscriber(index, feeds)
    await sub.start()
    def applied():
        return sum(index.resync_from(f.name) - 1 for f in feeds)
    while any(index.resync_from(f.name) < 1 for f in feeds):
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    while applied() < expect and time.monotonic() - t0 < timeout:
        await asyncio.sleep(0.05)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    await sub.aclose()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps({"applied": applied(), "cpu_s": cpu, "wall_s": t1 - t0}), flush=True)

import uvloop  # as the filter server runs
with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
    runner.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
"""


def _batch(seq: int, hashes: int) -> bytes:
    if seq == 0:
        return encode_batch(KVEventBatch(ts=0.0, events=[AllBlocksCleared()]))
    base = seq * hashes
    ids = list(range(base, base + hashes))
    event = BlockStored([h * 2654435761 % (1 << 63) for h in ids], None, ids, 1, None)
    return encode_batch(KVEventBatch(ts=float(seq), events=[event]))


class Replica:
    """One publisher: an XPUB, and a ROUTER that replays from its log (served by a thread)."""

    def __init__(self, ctx: zmq.Context[Any], where: str, i: int) -> None:
        self.pub, self.router = ctx.socket(zmq.XPUB), ctx.socket(zmq.ROUTER)
        for s in (self.pub, self.router):
            s.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(f"ipc://{where}/r{i}.pub")
        self.router.bind(f"ipc://{where}/r{i}.replay")
        self.log: list[bytes] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _, raw = self.router.recv_multipart()
            with self.lock:
                tail = self.log[decode_seq(raw) :]
                first = len(self.log) - len(tail)
            for k, payload in enumerate(tail):
                self.router.send_multipart([ident, b"", encode_seq(first + k), payload])
            self.router.send_multipart([ident, b"", encode_seq(END_SEQ), b""])

    def publish(self, payload: bytes) -> None:
        with self.lock:
            seq = len(self.log)
            self.log.append(payload)
        self.pub.send_multipart([b"", encode_seq(seq), payload])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.pub.close()
        self.router.close()


def measure(src: Path, replicas: int, rate: float, seconds: float, hashes: int) -> dict[str, Any]:
    expect = int(rate * seconds)
    payloads = [_batch(s, hashes) for s in range(expect // replicas + 2)]
    ctx: zmq.Context[Any] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="tw-kvb-") as where:
        reps = [Replica(ctx, where, i) for i in range(replicas)]
        for r in reps:
            r.publish(payloads[0])
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, where, str(replicas), str(expect), str(seconds * 4 + 10)],
            cwd=src, stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(src)},
        )  # fmt: skip
        try:
            assert child.stdout is not None
            for r in reps:  # the SUB's subscription reached it: nothing sent from here is lost
                assert r.pub.poll(20_000), "no subscription"
                r.pub.recv()
            assert child.stdout.readline().strip() == "ready"
            t0, sent = time.perf_counter(), 0
            while sent < expect:
                due = t0 + sent / rate
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                reps[sent % replicas].publish(payloads[1 + sent // replicas])
                sent += 1
            result = json.loads(child.stdout.readline())
            child.wait(timeout=30)
        finally:
            child.kill()
            for r in reps:
                r.close()
            ctx.destroy(linger=0)
    result["us_per_batch"] = 1e6 * result["cpu_s"] / max(1, result["applied"])
    result["expected"] = expect
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline-src", type=Path, help="older source tree (its subscriber)")
    ap.add_argument("--rates", type=float, nargs="+", default=[500.0, 2000.0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--hashes", type=int, default=128)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/kv_events_bench.json")
    a = ap.parse_args()
    sides = {"new": ROOT} | ({"old": a.baseline_src.resolve()} if a.baseline_src else {})
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in sides}
    for k in range(a.rounds):
        order = list(sides) if k % 2 == 0 else list(reversed(sides))
        for rate in a.rates:
            for side in order:
                r = measure(sides[side], a.replicas, rate, a.seconds, a.hashes)
                runs[side].setdefault(str(rate), []).append(r)
                print(f"round {k} rate {rate:.0f}/s {side}: {r['us_per_batch']:.1f} us/batch"
                      f" ({r['applied']}/{r['expected']} applied)", flush=True)  # fmt: skip
    summary = {
        side: {rate: statistics.median(r["us_per_batch"] for r in rs) for rate, rs in by.items()}
        for side, by in runs.items()
    }
    print("\n| batches/s | " + " | ".join(f"{s} us/batch (median)" for s in sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for rate in map(str, a.rates):
        print(
            f"| {float(rate):.0f} | " + " | ".join(f"{summary[s][rate]:.1f}" for s in sides) + " |"
        )
    a.out.write_text(json.dumps({"config": vars(a) | {"out": str(a.out), "baseline_src":
        str(a.baseline_src)}, "summary": summary, "runs": runs}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
