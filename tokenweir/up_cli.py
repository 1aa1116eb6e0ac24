"""The ``tokenweir up`` command line: parse, lock the state folder, run a :class:`Mesh`
until Ctrl-C (see :mod:`tokenweir.up` for what starts and in which order)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path

from controlplane.tls_material import TlsMaterialError
from policy import Policy
from policy.ports import port_clashes, port_plan
from policy.servers import Replicas
from runtime.children import ChildError
from runtime.ports import port_open
from runtime.process import Signals
from runtime.statedir import StateDirBusy, StateLock, default_state_dir, remove_mesh_info
from tokenweir.up import Mesh
from tokenweir.up_secure import Secure, admin_token_file, ensure_gateway_certs

__all__ = ["port_problems", "register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("up", help="start the local mesh described by a policy (Ctrl-C stops it)")
    p.add_argument("-c", "--config", type=Path, required=True)
    p.add_argument("--run-dir", type=Path, help="logs and bootstraps (default: a temporary folder)")
    p.add_argument("--redis-url", help="use this Redis instead of starting one")
    p.add_argument(
        "--state-dir",
        type=Path,
        help="Redis data kept across runs (default: .tokenweir/state next to the policy)",
    )
    p.add_argument(
        "--fresh", action="store_true", help="start with an empty state (drops live edits)"
    )
    p.add_argument(
        "--sotw", action="store_true", help="Envoys use State-of-the-World xDS (default: policy)"
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        help="seconds requests in flight may finish on Ctrl-C (default: control_plane.drain_timeout)",
    )
    p.add_argument(
        "--replicas",
        help="how many of each to start: gateway=N,filters=N,ratelimit=N,controlplane=N "
        "(default: the policy's replicas; docs/deploy.md)",
    )
    p.add_argument(
        "--autoscale",
        action="store_true",
        help="start and drain the emulated replicas of pools with `autoscale:` on the online "
        "planner's desired count (docs/capacity.md)",
    )
    p.add_argument(
        "--no-prometheus", action="store_true", help="do not start Prometheus even if installed"
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=0,
        help="Prometheus on 127.0.0.1:PORT (default: a free port)",
    )
    p.add_argument(
        "--scrape-interval", type=float, default=5.0, help="Prometheus scrape interval, seconds"
    )
    p.set_defaults(func=_run)


def port_problems(policy: Policy, replicas: Replicas | None, prometheus_port: int = 0) -> list[str]:
    """The port plan's clashes once ``--replicas`` is applied (the file itself passed the same
    check when it loaded), and a ``--prometheus-port`` that a part of the mesh listens on."""
    if replicas is not None:
        policy = dataclasses.replace(policy, replicas=replicas)
    flag = f"--replicas {replicas}: " if replicas is not None else ""
    out = [f"{flag}{c.key}: {c.message}" for c in port_clashes(port_plan(policy))]
    users = {c.port: c.user for c in port_plan(policy)}
    if prometheus_port in users:
        out.append(
            f"--prometheus-port {prometheus_port}: port already used by {users[prometheus_port]}; "
            "fix: pick another port, or leave the flag out for a free one"
        )
    return out


def ports_taken(config: Path, policy: Policy, replicas: Replicas | None) -> list[str]:
    """The ports of the plan another process already listens on. Checked before anything
    starts: the part would fail to bind and be restarted again and again, while the stranger
    answered its readiness check (``up`` said ready; the gateway answered
    ``no_healthy_upstream``)."""
    if replicas is not None:
        policy = dataclasses.replace(policy, replicas=replicas)
    # an autoscaled pool's replicas start on demand, each on the first of its slots that binds
    # (a slot another process holds is counted and skipped): not refused here
    fleets = {f"emulator {n}" for n, p in policy.pools.items() if p.autoscale is not None}
    out = []
    for claim in port_plan(policy):
        if claim.part in fleets:
            continue
        host = claim.host if claim.host not in (None, "", "0.0.0.0", "::") else "127.0.0.1"
        if port_open(host, claim.port):
            name = claim.part if claim.replica is None else f"{claim.part}#{claim.replica}"
            out.append(
                f"{config}: {claim.key}: {host}:{claim.port} ({name}, {claim.what}) is already "
                "in use by another process; fix: stop that process, or move the port"
            )
    return out


def _run(args: argparse.Namespace) -> int:
    from tokenweir.admin_args import load_or_report

    state_dir = (args.state_dir or default_state_dir(args.config)).resolve()
    try:  # certificates the policy names in the state directory, made before it is loaded
        ca_file = ensure_gateway_certs(args.config, state_dir)
    except TlsMaterialError as exc:
        print(f"tokenweir up: {exc}", file=sys.stderr)
        return 1
    policy = load_or_report(args.config)
    if policy is None:
        return 1
    token_file = None
    if any(gw.tls is not None for gw in policy.gateways.values()):  # a production mesh
        token_file = admin_token_file(state_dir, os.environ)
    try:
        replicas = Replicas.parse(args.replicas, policy.replicas) if args.replicas else None
    except ValueError as exc:
        print(f"tokenweir up: --replicas: {exc}", file=sys.stderr)
        return 2
    if args.autoscale and (replicas or policy.replicas).controlplane > 1:
        print("tokenweir up: --autoscale runs with one control plane", file=sys.stderr)
        return 2
    problems = port_problems(policy, replicas, args.prometheus_port)
    if problems:  # before anything starts: two parts on one port cross-wire the mesh silently
        for problem in problems:
            print(f"tokenweir up: {problem}", file=sys.stderr)
        print(f"tokenweir up: {len(problems)} port clash(es); nothing started", file=sys.stderr)
        return 2
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="tokenweir-up-"))
    lock = StateLock(state_dir)
    try:
        lock.acquire()
    except (StateDirBusy, OSError) as exc:
        print(f"tokenweir up: {exc}", file=sys.stderr)
        return 1
    # after the lock: a second `up` of this mesh is named as such, not as a port in use
    taken = ports_taken(args.config, policy, replicas)
    if taken:
        for problem in taken:
            print(f"tokenweir up: {problem}", file=sys.stderr)
        print(f"tokenweir up: {len(taken)} port(s) in use; nothing started", file=sys.stderr)
        lock.release()
        return 1
    if args.fresh:
        shutil.rmtree(state_dir / "redis", ignore_errors=True)
    mesh = Mesh(
        args.config,
        policy,
        run_dir,
        redis_url=args.redis_url,
        delta=policy.control_plane.delta and not args.sotw,
        state_dir=state_dir,
        replicas=replicas,
        prometheus=None if args.no_prometheus else (args.prometheus_port, args.scrape_interval),
        autoscale=args.autoscale,
        secure=Secure(ca_file=ca_file, admin_token_file=token_file),
    )

    drain = args.drain_timeout
    if drain is None:
        drain = policy.control_plane.drain_timeout

    async def main() -> int:
        signals = Signals()
        try:
            await mesh.start()
        except (ChildError, OSError, RuntimeError) as exc:
            print(f"tokenweir up: failed to start: {exc}", file=sys.stderr)
            await mesh.aclose()
            return 1
        print(mesh.summary(), flush=True)
        waiter = asyncio.create_task(signals.first.wait())
        watcher = asyncio.create_task(mesh.watch_children())
        done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        for task in (waiter, watcher):
            task.cancel()
        if watcher in done and (failure := watcher.exception()) is not None:  # never by design
            print(f"tokenweir up: supervising failed: {failure!r}", file=sys.stderr)
        print(f"tokenweir up: draining (up to {drain:g}s) ...", flush=True)
        await mesh.aclose(drain, force=signals.second)
        print("tokenweir up: stopped", flush=True)
        return 1 if watcher in done else 0

    try:
        return asyncio.run(main())
    finally:
        remove_mesh_info(state_dir)
        lock.release()
