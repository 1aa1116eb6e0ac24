"""Config change → applied on every Envoy: push latency of our ADS server, SotW vs Delta.

The control plane runs in a child process (``bench/xds_push_server.py``) so that its CPU time and memory are
measured alone; this process starts N real Envoys (``--concurrency 1``, only the stats it
polls kept) and, for each change, polls every Envoy's admin API until the change shows.

A change moves one endpoint of one cluster (alternately adding and removing it), i.e. what an
endpoint-file rewrite does. "Applied" means the cluster's ``membership_total`` stat on that
Envoy has the new value. Latency is measured from the moment the child published the snapshot
(CLOCK_MONOTONIC is shared by all processes) to the first poll that saw it.

Usage:  .venv/bin/python bench/xds_push.py [--envoys 1 10 50] [--changes 20] [--quick]
Writes: bench/results/xds_push.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from xds_push_server import GROUP  # the node cluster the child serves

from tokenweir.envoy_launcher import EnvoyProcess, EnvoySettings

RESULTS = Path(__file__).parent / "results" / "xds_push.json"
SIZES = {"small": (10, 10), "large": (1000, 10)}  # clusters, endpoints per cluster
POLLS_PER_S = 1500  # each poll costs Envoy ~0.15 ms CPU with 1,000 clusters


# ----------------------------------------------------------------------------- driver
class Admin:
    """A tiny keep-alive HTTP/1.1 client for one Envoy admin port (cheaper than aiohttp)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self, path: str) -> str:
        if self._conn is None:
            self._conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._conn
        writer.write(f"GET {path} HTTP/1.1\r\nHost: admin\r\n\r\n".encode())
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        if b"transfer-encoding: chunked" not in head:
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            return (await reader.readexactly(length)).decode()
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readexactly(2)
        return body.decode()

    async def gauge(self, name: str) -> int | None:
        """One gauge's value. The Prometheus endpoint limited to gauges costs Envoy ~0.15 ms
        with 1,000 clusters; plain ``/stats?filter=`` costs ~1.7 ms, enough to distort this
        benchmark (measured with ``/proc/<pid>/stat`` on this machine)."""
        body = await self.get(f"/stats/prometheus?type=Gauges&filter=^{name.replace('.', '[.]')}$")
        for line in body.splitlines():
            if line and not line.startswith("#"):
                return int(float(line.rsplit(" ", 1)[1]))
        return None

    async def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            with contextlib.suppress(OSError):
                await self._conn[1].wait_closed()


class ControlPlane:
    def __init__(self, listen: int) -> None:
        self.listen = listen
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> int:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__).with_name("xds_push_server.py")),
            str(self.listen),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
        return int((await self._line())["port"])

    async def ask(self, command: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\n".encode())
        await self.proc.stdin.drain()
        return await self._line()

    async def _line(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        if not line:
            raise RuntimeError("control plane child exited")
        return dict(json.loads(line))

    async def aclose(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                await self.ask("quit")
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


@dataclass
class Result:
    mode: str
    envoys: int
    size: str
    clusters: int
    endpoints: int
    changes: int
    every_p50_ms: float
    every_p99_ms: float
    every_max_ms: float
    each_p50_ms: float
    each_p99_ms: float
    poll_interval_ms: float
    cp_cpu_ms_per_change: float  # check, publish and push to all Envoys (building excluded)
    cp_rss_mb: float
    envoy_cpu_ms_per_change: float  # per Envoy, polling of its admin API included
    envoy_rss_mb: float
    acked_all_p50_ms: float  # server side: publication → last Envoy's EDS ACK
    acked_all_p99_ms: float


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def wait_value(admin: Admin, stat: str, want: int, since: float, interval: float) -> float:
    deadline = since + 30
    while True:
        if await admin.gauge(stat) == want:
            return time.monotonic() - since
        if time.monotonic() > deadline:
            raise TimeoutError(f"{stat} never reached {want}")
        await asyncio.sleep(interval)


def cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def envoy_rss_mb(proxies: list[EnvoyProcess]) -> float:
    sizes = []
    for proxy in proxies:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{proxy.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    sizes.append(int(line.split()[1]) / 1024)
    return statistics.mean(sizes) if sizes else 0.0


async def converge(plane: ControlPlane, admins: list[Admin], size: str) -> None:
    clusters, per = SIZES[size]
    answer = await plane.ask(f"size {clusters} {per}")
    stat = "cluster_manager.active_clusters"  # ours plus the static xds_cluster
    await asyncio.gather(
        *(wait_value(a, stat, clusters + 1, answer["published"], 0.05) for a in admins)
    )
    last = f"cluster.c{clusters - 1:04d}.membership_total"
    await asyncio.gather(*(wait_value(a, last, per, answer["published"], 0.05) for a in admins))


async def measure(
    plane: ControlPlane,
    admins: list[Admin],
    proxies: list[EnvoyProcess],
    mode: str,
    size: str,
    changes: int,
) -> Result:
    clusters, per = SIZES[size]
    # A fixed total poll budget (POLLS_PER_S admin requests/s over all Envoys), so that
    # polling does not eat the two cores the Envoys and the control plane share.
    interval = max(0.002, len(admins) / POLLS_PER_S)
    before = await plane.ask("stats")
    envoy_cpu_before = sum(cpu_seconds(p.pid) for p in proxies)
    every: list[float] = []
    each: list[float] = []
    acked_all: list[float] = []
    for change in range(changes):
        answer = await plane.ask(f"bump {change * 7}")
        stat = f"cluster.{answer['cluster']}.membership_total"
        times = await asyncio.gather(
            *(wait_value(a, stat, answer["members"], answer["published"], interval) for a in admins)
        )
        each.extend(times)
        every.append(max(times))
        await asyncio.sleep(0.05)
        ack_times = (await plane.ask("acks"))["times"]
        if len(ack_times) >= len(admins):  # every Envoy acknowledged this change
            acked_all.append(sorted(ack_times)[len(admins) - 1] - answer["published"])
    after = await plane.ask("stats")
    envoy_cpu = sum(cpu_seconds(p.pid) for p in proxies) - envoy_cpu_before
    ms = 1000.0
    return Result(
        mode=mode,
        envoys=len(admins),
        size=size,
        clusters=clusters,
        endpoints=clusters * per,
        changes=changes,
        every_p50_ms=percentile(every, 0.5) * ms,
        every_p99_ms=percentile(every, 0.99) * ms,
        every_max_ms=max(every) * ms,
        each_p50_ms=percentile(each, 0.5) * ms,
        each_p99_ms=percentile(each, 0.99) * ms,
        poll_interval_ms=interval * ms,
        cp_cpu_ms_per_change=(
            (after["cpu_s"] - after["render_cpu_s"]) - (before["cpu_s"] - before["render_cpu_s"])
        )
        / changes
        * ms,
        cp_rss_mb=after["rss_mb"],
        envoy_cpu_ms_per_change=envoy_cpu / changes / len(proxies) * ms,
        envoy_rss_mb=envoy_rss_mb(proxies),
        acked_all_p50_ms=percentile(acked_all, 0.5) * ms if acked_all else -1,
        acked_all_p99_ms=percentile(acked_all, 0.99) * ms if acked_all else -1,
    )


def _watched_stats(changes: int) -> tuple[str, ...]:
    """Keep only the stats the benchmark polls: a stats filter then scans a few dozen names."""
    names = set()
    for clusters, _ in SIZES.values():
        names |= {f"c{(change * 7) % clusters:04d}" for change in range(changes)}
        names.add(f"c{clusters - 1:04d}")
    return (
        r"^cluster_manager\.active_clusters$",
        rf"^cluster\.({'|'.join(sorted(names))})\.membership_total$",
    )


async def run_mode(
    mode: str, counts: list[int], changes: int, work: Path, listen: int
) -> list[Result]:
    plane = ControlPlane(listen)
    xds_port = await plane.start()
    proxies: list[EnvoyProcess] = []
    admins: list[Admin] = []
    results: list[Result] = []
    order = ["small", "large"]
    try:
        for count in counts:
            while len(proxies) < count:
                index = len(proxies)
                settings = EnvoySettings(
                    node_id=f"{mode}-{index}",
                    node_cluster=GROUP,
                    xds_port=xds_port,
                    base_id=(os.getpid() % 1000) * 100 + index + (50 if mode == "delta" else 0),
                    delta=mode == "delta",
                    concurrency=1,
                    log_level="error",
                    buffer_limit_bytes=32 * 1024,
                    stats_inclusion=_watched_stats(changes),
                )
                proxy = EnvoyProcess(settings, work)
                proxies.append(proxy)
                await proxy.start(timeout=120, wait_ready=False)
                admins.append(Admin(proxy.admin_url))
            for size in order:
                await converge(plane, admins, size)
                result = await measure(plane, admins, proxies, mode, size, changes)
                print(_row(result), flush=True)
                results.append(result)
            order.reverse()  # fewer transitions between the small and large configs
    finally:
        for admin in admins:
            await admin.close()
        await asyncio.gather(*(p.aclose() for p in proxies))
        await plane.aclose()
    return results


HEADER = (
    "| mode | Envoys | clusters / endpoints | every Envoy p50 | p99 | max | per Envoy p50 | p99 "
    "| all ACKed p50 / p99 (server) | CP CPU per change | CP RSS | Envoy CPU per change (each) "
    "| Envoy RSS (each) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _row(r: Result) -> str:
    return (
        f"| {r.mode} | {r.envoys} | {r.clusters:,} / {r.endpoints:,} | {r.every_p50_ms:.1f} ms "
        f"| {r.every_p99_ms:.1f} ms | {r.every_max_ms:.1f} ms | {r.each_p50_ms:.1f} ms "
        f"| {r.each_p99_ms:.1f} ms | {r.acked_all_p50_ms:.1f} / {r.acked_all_p99_ms:.1f} ms "
        f"| {r.cp_cpu_ms_per_change:.1f} ms "
        f"| {r.cp_rss_mb:.0f} MB | {r.envoy_cpu_ms_per_change:.1f} ms | {r.envoy_rss_mb:.0f} MB |"
    )


async def main_async(args: argparse.Namespace) -> None:
    from tests.helpers import free_port

    listen = free_port()
    results: list[Result] = []
    started = time.monotonic()
    print(f"load average before: {os.getloadavg()}", flush=True)
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="tw-xds-bench-") as tmp:
        for mode in args.modes:
            results += await run_mode(mode, args.envoys, args.changes, Path(tmp), listen)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": f"{os.cpu_count()} cores",
                "loadavg_after": os.getloadavg(),
                "wall_s": time.monotonic() - started,
                "results": [asdict(r) for r in results],
            },
            indent=1,
        )
    )
    print(f"\nwrote {RESULTS} in {time.monotonic() - started:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envoys", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--modes", nargs="+", default=["sotw", "delta"])
    parser.add_argument("--changes", type=int, default=20)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.* helpers, as a script
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
