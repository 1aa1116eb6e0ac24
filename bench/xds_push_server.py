"""The control plane of ``bench/xds_push.py``, run as its child so that its CPU time and memory
are measured alone: an ADS server (``controlplane.xds``) over hand-built snapshots of N clusters,
driven by one command per line on stdin, one JSON answer per line on stdout.

Usage (by ``bench/xds_push.py``): ``python bench/xds_push_server.py LISTEN_PORT``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

GROUP = "bench"


def _snapshot(version: str, clusters: int, per: int, bumped: dict[int, bool], listen: int) -> Any:
    from tests.controlplane.xds import resources as r  # hand-built protos shared with tests

    items: list[Any] = []
    routes = []
    for i in range(clusters):
        name = f"c{i:04d}"
        ports = [20000 + (i * per + j) % 40000 for j in range(per)]
        if bumped.get(i):
            ports.append(61000 + i % 4000)
        items += [r.eds_cluster(name), r.cla(name, ports)]
        routes.append((f"/{name}/", name))
    items += [r.listener("in", listen, "rt"), r.route_config("rt", routes)]
    return r.snapshot(version, *items)


async def serve(listen: int) -> None:
    """Child: an ADS server driven by commands on stdin, one JSON answer per line."""
    from prometheus_client import CollectorRegistry

    from controlplane.xds.cache import SnapshotCache
    from controlplane.xds.metrics import XdsMetrics
    from controlplane.xds.server import XdsServer

    class AckTimes(XdsMetrics):
        """The server's metrics, plus the moment of every EDS ACK (server-side view)."""

        def __init__(self, registry: CollectorRegistry) -> None:
            super().__init__(registry)
            self.eds_acks: list[float] = []

        def acked(self, type_url: str, mode: str, seconds: float) -> None:
            super().acked(type_url, mode, seconds)
            if type_url.endswith("ClusterLoadAssignment"):
                self.eds_acks.append(time.monotonic())

    registry = CollectorRegistry()
    cache = SnapshotCache()
    metrics = AckTimes(registry)
    server = XdsServer(cache, registry=registry, metrics=metrics)
    port = await server.start()
    print(json.dumps({"port": port}), flush=True)
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    clusters = per = 0
    bumped: dict[int, bool] = {}
    version = 0
    render_cpu = 0.0  # building the protos stands in for the translator: not the server's cost
    while line := (await reader.readline()).decode().strip():
        command, *args = line.split()
        answer: dict[str, Any] = {}
        if command == "size":
            clusters, per = int(args[0]), int(args[1])
            bumped = {}
        elif command == "bump":
            target = int(args[0]) % clusters
            bumped[target] = not bumped.get(target, False)
            answer = {"cluster": f"c{target:04d}", "members": per + int(bumped[target])}
        elif command == "stats":
            answer = {**_process_stats(), "render_cpu_s": render_cpu}
        elif command == "acks":  # EDS ACK times since the last publication
            answer = {"times": metrics.eds_acks}
        elif command == "quit":
            break
        if command in ("size", "bump"):
            version += 1
            render_start = time.process_time()
            snap = _snapshot(str(version), clusters, per, bumped, listen)
            render_cpu += time.process_time() - render_start
            start = time.monotonic()
            metrics.eds_acks = []
            cache.set_snapshot(GROUP, snap)
            answer.update(published=start, build_s=time.monotonic() - start)
        print(json.dumps(answer), flush=True)
    await server.aclose()


def _process_stats() -> dict[str, Any]:
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {
        "cpu_s": cpu,
        "rss_mb": int(status["VmRSS"].split()[0]) / 1024,
        "hwm_mb": int(status["VmHWM"].split()[0]) / 1024,
    }


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.* helpers, as a script
    asyncio.run(serve(int(sys.argv[1])))
