"""The supervisor drill (docs/runbooks.md, "A part of `tokenweir up` dies"): `tokenweir up` on
examples/mesh.yaml under steady load; each kind of child is SIGKILLed in turn — Redis, one
emulator, the filter server, the rate-limit service, the gateway's Envoy. After each, `up` is
still running, says the part rejoined, and the gateway keeps answering: a request is served, or
gets a JSON error with `Retry-After` (for Envoy itself: a refused connection, only until it is
back), and requests are served again within ``RECOVERY_S`` of the kill. Redis comes back on its
port with its data; the rate-limit service decides in it again; the emulator keeps its port.

One mesh and one load run for the module; the tests run in order.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from tests.integration.example_mesh import example_policy
from tests.integration.up_process import mesh_redis_url, start_up

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(240)]

RECOVERY_S = 10.0  # from a kill to requests served again (docs/runbooks.md states it)
QUIET_S = 2.0  # a part has recovered once requests have been served this long without a failure
CLIENTS = 3
BODY = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Outcome:
    sent: float
    done: float
    what: str  # "ok", "json-retry" (a JSON error with Retry-After), "refused", or what was wrong


@dataclass
class Load:
    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, i: int) -> None:
        n = 0
        with httpx.Client(timeout=10.0) as http:
            while not self.stop.is_set():
                n += 1
                sent = time.monotonic()
                headers = {"authorization": "Bearer tw-demo-pro-key", "x-session-id": f"c{i}-{n}"}
                try:
                    r = http.post(self.url, json=BODY, headers=headers)
                    what = _judge(r)
                except httpx.ConnectError:
                    what = "refused"
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    what = "cut"  # the process that held the connection died
                except httpx.HTTPError as exc:
                    what = f"{type(exc).__name__}"
                self.outcomes.append(Outcome(sent, time.monotonic(), what))
                if what != "ok":
                    time.sleep(0.05)  # as a client would, not a busy loop

    def since(self, t: float) -> list[Outcome]:
        return [o for o in list(self.outcomes) if o.sent >= t]


def _judge(r: httpx.Response) -> str:
    if r.status_code == 200:
        return "ok"
    try:
        body = r.json()
    except json.JSONDecodeError:
        return f"{r.status_code} not JSON: {r.text[:120]!r}"
    if "error" not in body:
        return f"{r.status_code} JSON without error: {r.text[:120]!r}"
    if "retry-after" not in r.headers:
        return f"{r.status_code} without Retry-After: {r.text[:120]!r}"
    return "json-retry"


@dataclass
class Drill:
    proc: subprocess.Popen[str]
    banner: str
    load: Load
    run_dir: Path
    output: list[str] = field(default_factory=list)
    results: dict[str, dict[str, object]] = field(default_factory=dict)

    def later(self) -> str:
        return "".join(self.output)

    def metrics_url(self, label: str) -> str:
        m = re.search(rf"^\s*{label}\s.*?metrics (http://\S+/metrics)", self.banner, re.M)
        assert m is not None, self.banner
        return m.group(1)

    def metric(self, url: str, needle: str) -> float:
        with urllib.request.urlopen(url, timeout=5) as r:
            lines = r.read().decode().splitlines()
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith(needle))

    def child_pid(self, needle: str) -> int:
        """The pid of ``up``'s direct child whose command line holds ``needle``."""
        rows = subprocess.run(
            ["ps", "-ww", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True
        ).stdout.splitlines()
        found = []
        for row in rows:
            pid, ppid, args = row.split(None, 2)
            if int(ppid) == self.proc.pid and needle in args:
                found.append(int(pid))
        assert len(found) == 1, (needle, found)
        return found[0]

    def kill(self, name: str, needle: str) -> dict[str, object]:
        """SIGKILL the child; wait for `up` to say it rejoined and for requests served again."""
        pid = self.child_pid(needle)
        return self.down(name, lambda: os.kill(pid, signal.SIGKILL), status=-9)

    def down(self, name: str, act: Callable[[], object], *, status: int) -> dict[str, object]:
        """``act`` makes the child exit with ``status``; the rest as :meth:`kill`."""
        mark = len(self.later())
        killed = time.monotonic()
        act()
        rejoined = None
        while time.monotonic() - killed < RECOVERY_S + 20:
            assert self.proc.poll() is None, f"up ended:\n{self.later()}"
            if f"tokenweir up: {name} rejoined" in self.later()[mark:]:
                rejoined = time.monotonic() - killed
                break
            time.sleep(0.05)
        assert rejoined is not None, f"up never said {name} rejoined:\n{self.later()[mark:]}"
        said = self.later()[mark:]
        assert f"tokenweir up: {name} exited with {status}" in said, said
        recovered = self._recovered(killed)
        outcomes = self.load.since(killed)
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.what] = counts.get(o.what, 0) + 1
        result = {"rejoined_s": round(rejoined, 2), "recovered_s": round(recovered, 2), **counts}
        self.results[name] = result
        assert self.proc.poll() is None, f"up ended:\n{self.later()}"
        return result

    def _recovered(self, killed: float) -> float:
        """Seconds from the kill to the end of the last failed request; waits until requests
        have been served for ``QUIET_S`` without one."""
        deadline = killed + RECOVERY_S + 20
        while time.monotonic() < deadline:
            now = time.monotonic()
            after = self.load.since(killed)
            bad = [o for o in after if o.what != "ok"]
            last_bad = max((o.done for o in bad), default=killed)
            calm = [o for o in after if o.sent > last_bad]
            if now - last_bad >= QUIET_S and len(calm) >= 5:
                return last_bad - killed
            time.sleep(0.1)
        raise AssertionError(f"not served again within {deadline - killed:.0f}s")


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drill]:
    tmp = tmp_path_factory.mktemp("supervisor")
    # the drills' parts (three chat replicas, the fallback pool); not the batch API, the sidecar
    text, gw = example_policy(batch=False, sidecar=False)
    policy = tmp / "mesh.yaml"
    policy.write_text(text)
    proc, banner = start_up(policy, tmp / "run")
    load = Load(f"http://127.0.0.1:{gw}/v1/chat/completions")
    d = Drill(proc, banner, load, tmp / "run")
    reader = threading.Thread(target=_read, args=(proc, d.output), daemon=True)
    clients = [threading.Thread(target=load.run, args=(i,), daemon=True) for i in range(CLIENTS)]
    try:
        assert "tokenweir up: ready" in banner, banner
        reader.start()
        for c in clients:
            c.start()
        deadline = time.monotonic() + 30  # the first requests warm everything up
        while sum(o.what == "ok" for o in list(load.outcomes)) < 10:
            assert time.monotonic() < deadline, load.outcomes[:5]
            time.sleep(0.1)
        yield d
    finally:
        load.stop.set()
        for c in clients:
            if c.ident is not None:  # started (a failed start-up never starts them)
                c.join(15)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        reader.join(5)
        if proc.stdout is not None:
            proc.stdout.close()
        print("\nsupervisor drills:", json.dumps(d.results, indent=1))


def _read(proc: subprocess.Popen[str], out: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)


def _settle(d: Drill) -> bool:
    time.sleep(1.0)  # the reader thread takes the last lines
    return "tokenweir up: stopped" in d.later()


def _wrong(d: Drill, since: float, *, down_until: float | None = None) -> list[str]:
    """What the gateway answered since ``since`` that it should not have: anything but a served
    request or a JSON error with Retry-After; while the gateway's own Envoy is down (requests sent
    before ``down_until``), a refused or cut connection too."""
    wrong = []
    for o in d.load.since(since):
        if o.what in ("ok", "json-retry"):
            continue
        if down_until is not None and o.what in ("refused", "cut") and o.sent <= down_until:
            continue
        wrong.append(o.what)
    return wrong


def test_redis_comes_back_on_its_port_with_its_data(drill: Drill) -> None:
    r = redis.Redis.from_url(mesh_redis_url(drill.run_dir.parent / "mesh.yaml"))
    r.set("drill:marker", "kept")
    time.sleep(1.5)  # appendfsync everysec
    start = time.monotonic()
    drill.kill("redis", "redis-server")
    assert r.get("drill:marker") == b"kept"  # the same port, the append-only file replayed
    r.close()
    rl = drill.metrics_url("ratelimit")
    deadline = time.monotonic() + RECOVERY_S
    while drill.metric(rl, "tokenweir_ratelimit_redis_up") != 1:  # deciding in Redis again
        assert time.monotonic() < deadline, "the rate-limit service did not use Redis again"
        time.sleep(0.2)
    assert _wrong(drill, start) == []


def test_an_emulator_comes_back_on_its_port(drill: Drill) -> None:
    m = re.search(r"emulator\s+chat#1 (http://\S+) ", drill.banner)
    assert m is not None, drill.banner
    port = m.group(1).rsplit(":", 1)[1]
    start = time.monotonic()
    drill.kill("emulator chat#1", f"--port {port}")
    with urllib.request.urlopen(m.group(1) + "/health", timeout=5) as r:
        assert r.status == 200
    cp = drill.metrics_url("control plane")
    deadline = time.monotonic() + RECOVERY_S
    while not _replica_up(drill, cp, port):  # the pool state sees it again
        assert time.monotonic() < deadline, "the control plane's pool state lost the replica"
        time.sleep(0.2)
    assert _wrong(drill, start) == []


def _replica_up(drill: Drill, cp: str, port: str) -> bool:
    with urllib.request.urlopen(cp, timeout=5) as r:
        lines = r.read().decode().splitlines()
    mine = [
        ln
        for ln in lines
        if ln.startswith("tokenweir_replica_up{")
        and f'endpoint="127.0.0.1:{port}"' in ln
        and 'pool="chat"' in ln
    ]
    return len(mine) == 1 and float(mine[0].rsplit(" ", 1)[1]) == 1.0


def test_an_emulator_that_crashes_on_its_own_comes_back(drill: Drill) -> None:
    """The emulator's `crash` fault (exit status 70), as in the issue that asked for this."""
    m = re.search(r"emulator\s+chat#2 (http://\S+) ", drill.banner)
    assert m is not None, drill.banner
    start = time.monotonic()

    def crash() -> None:
        req = urllib.request.Request(
            m.group(1) + "/_emulator/faults", data=b'{"crash": true}', method="POST",
            headers={"content-type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()

    drill.down("emulator chat#2", crash, status=70)
    assert _wrong(drill, start) == []


def test_the_filter_server_comes_back(drill: Drill) -> None:
    start = time.monotonic()
    drill.kill("filters", "-m filters")
    assert _wrong(drill, start) == []


def test_the_rate_limit_service_comes_back(drill: Drill) -> None:
    start = time.monotonic()
    drill.kill("ratelimit", "-m ratelimit_service")
    assert _wrong(drill, start) == []


def test_the_gateway_envoy_comes_back(drill: Drill) -> None:
    start = time.monotonic()
    result = drill.kill("envoy edge", "envoy-edge-0.json")
    down_until = start + float(result["rejoined_s"]) + 0.5  # type: ignore[arg-type]
    assert _wrong(drill, start, down_until=down_until) == []
    assert (drill.run_dir / "envoy-edge-0.log.1").exists()  # the dead one's log is kept
    assert float(result["recovered_s"]) <= RECOVERY_S, result  # type: ignore[arg-type]


def test_every_drill_recovered_in_time_and_was_counted(drill: Drill) -> None:
    assert set(drill.results) == {
        "redis", "emulator chat#1", "emulator chat#2", "filters", "ratelimit", "envoy edge",
    }, drill.results  # fmt: skip
    late = {n: r for n, r in drill.results.items() if float(r["recovered_s"]) > RECOVERY_S}  # type: ignore[arg-type]
    assert not late, late
    cp = drill.metrics_url("control plane")
    for name in drill.results:
        child = f'child="{name}"'
        assert drill.metric(cp, f"tokenweir_up_child_exits_total{{{child}}}") == 1, name
        assert drill.metric(cp, f'tokenweir_up_child_restarts_total{{{child},result="ok"}}') == 1
        assert drill.metric(cp, f"tokenweir_up_child_up{{{child}}}") == 1, name
    assert drill.proc.poll() is None
    drill.load.stop.set()
    drill.proc.send_signal(signal.SIGINT)  # asked: now, and only now, it ends
    assert drill.proc.wait(60) == 0, drill.later()
    assert "tokenweir up: stopped" in drill.later() or _settle(drill)
