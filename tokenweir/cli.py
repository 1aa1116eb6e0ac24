"""The ``tokenweir`` command: validate, render, serve, up, plan, quota."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from policy import Address
from tokenweir.admin_args import load_or_report

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["keys"]:  # its own parser, options included
        return _keys(argparse.Namespace(rest=argv[1:]))
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    return int(args.func(args))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tokenweir", description="A traffic governor for LLM inference."
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = p.add_subparsers(metavar="COMMAND")

    v = sub.add_parser("validate", help="check a policy file offline (same loader as the server)")
    _policy_args(v)
    v.set_defaults(func=_validate)

    r = sub.add_parser("render", help="print the Envoy resources a policy becomes (JSON)")
    _policy_args(r)
    r.add_argument("--node", help="only this node group (a gateway or sidecar name)")
    r.add_argument("--static", action="store_true", help="as a static Envoy bootstrap (one node)")
    r.set_defaults(func=_render)

    t = sub.add_parser(
        "sds", help="write the SDS files of the policy's TLS gateways (on a gateway's host)"
    )
    _policy_args(t)
    t.set_defaults(func=_sds)

    s = sub.add_parser("serve", help="run the control plane only (xDS + policy watcher + metrics)")
    s.add_argument("-c", "--config", type=Path, required=True)
    s.add_argument("--xds", type=Address.parse, help="override control_plane.xds (host:port)")
    s.add_argument(
        "--metrics", type=Address.parse, help="override control_plane.metrics (host:port)"
    )
    s.add_argument(
        "--drain-timeout", type=float, help="override control_plane.drain_timeout (seconds)"
    )
    s.add_argument(
        "--replicas",
        help="override the policy's replicas (gateway=N,filters=N,ratelimit=N,controlplane=N)",
    )
    s.add_argument(
        "--redis-url",
        default=os.environ.get("TOKENWEIR_REDIS_URL"),
        help="the rate-limit service's Redis, read by the dashboard for the tenants' budgets "
        "(default: ratelimit.redis_url)",
    )
    s.set_defaults(func=_serve)

    b = sub.add_parser(
        "bootstrap",
        help="print the bootstrap of an Envoy fed by the control plane(s) (JSON; Kubernetes)",
    )
    b.add_argument(
        "--xds",
        type=Address.parse,
        action="append",
        required=True,
        help="a control plane's host:port (repeat, or one DNS name for all)",
    )
    b.add_argument("--node-cluster", default="edge", help="the node group (gateway name)")
    b.add_argument("--admin", type=Address.parse, default=Address("127.0.0.1", 9901))
    b.add_argument("--sotw", action="store_true", help="State-of-the-World instead of Delta xDS")
    b.set_defaults(func=_bootstrap)

    from controlplane.planner.cli import register as register_plan
    from tokenweir.quota_cli import register as register_quota
    from tokenweir.shadow_cli import register as register_shadow
    from tokenweir.status_cli import register as register_status
    from tokenweir.up_cli import register as register_up

    register_up(sub)
    register_plan(sub)
    register_quota(sub)
    register_status(sub)
    register_shadow(sub)
    k = sub.add_parser(
        "keys",
        help="give, revoke and show API keys live in Redis (see `tokenweir keys --help`)",
        add_help=False,
    )
    k.add_argument("rest", nargs=argparse.REMAINDER)
    k.set_defaults(func=_keys)
    return p


def _policy_args(p: argparse.ArgumentParser) -> None:
    """``-c FILE`` as every command takes it; a bare path (the older form) still works."""
    p.add_argument("-c", "--config", type=Path, metavar="FILE", help="the policy file")
    p.add_argument("path", type=Path, nargs="?", help=argparse.SUPPRESS)
    p.set_defaults(policy_parser=p)


def _policy_path(args: argparse.Namespace) -> Path:
    """The one policy file ``-c`` or the bare path names (argparse's usage error otherwise)."""
    parser: argparse.ArgumentParser = args.policy_parser
    if args.config is not None and args.path is not None and args.config != args.path:
        parser.error(f"two policy files given ({args.config} and {args.path}); give one, with -c")
    path = args.config or args.path
    if path is None:
        parser.error("the policy file is required: -c FILE (e.g. -c examples/mesh.yaml)")
    return Path(path)


def _keys(args: argparse.Namespace) -> int:
    from filters.keys_admin import main as keys_main

    return keys_main(args.rest)


def _bootstrap(args: argparse.Namespace) -> int:
    from tokenweir.envoy_launcher import EnvoySettings, render_bootstrap

    first, *more = args.xds
    settings = EnvoySettings(
        node_id=args.node_cluster, node_cluster=args.node_cluster, xds_host=first.host,
        xds_port=first.port, xds_more=tuple((a.host, a.port) for a in more), base_id=0,
        admin_host=args.admin.host, admin_port=args.admin.port, delta=not args.sotw,
    )  # fmt: skip
    json.dump(render_bootstrap(settings), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def _validate(args: argparse.Namespace) -> int:
    """Load the policy and build everything every service builds from it (tokenweir.check)."""
    from tokenweir.check import check_file

    path = _policy_path(args)
    policy, issues = check_file(path)
    if issues or policy is None:
        for issue in sorted(issues):
            print(issue, file=sys.stderr)
        print(f"{path}: {len(issues)} problem(s); policy rejected", file=sys.stderr)
        return 1
    groups = len(policy.gateways) + len(policy.sidecars)
    print(
        f"{path}: OK ({len(policy.pools)} pools, {len(policy.services)} services, "
        f"{groups} node groups, {len(policy.tenants)} tenants)"
    )
    return 0


def _sds(args: argparse.Namespace) -> int:
    """What the control plane writes before publishing a TLS listener, for a gateway that runs
    on another host (a Kubernetes gateway pod: docs/deploy.md "TLS on Kubernetes")."""
    from controlplane.sds_files import write_sds_files

    policy = load_or_report(_policy_path(args))
    if policy is None:
        return 1
    try:
        written = write_sds_files(policy)
    except OSError as exc:
        print(f"tokenweir sds: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def _render(args: argparse.Namespace) -> int:
    policy = load_or_report(_policy_path(args))
    if policy is None:
        return 1
    from controlplane.translate.render import render, to_json
    from controlplane.translate.static import static_bootstrap

    groups = render(policy)
    if args.node is not None:
        if args.node not in groups:
            print(f"unknown node group {args.node!r}; known: {sorted(groups)}", file=sys.stderr)
            return 1
        groups = {args.node: groups[args.node]}
    if args.static:
        if len(groups) != 1:
            print("--static needs --node NAME (one bootstrap per Envoy)", file=sys.stderr)
            return 1
        ((node, res),) = groups.items()
        out: object = static_bootstrap(res, node_id=node)
    else:
        out = to_json(groups)
    json.dump(out, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from controlplane.app import ControlPlane, ControlPlaneSettings

    policy = load_or_report(args.config)
    if policy is None:
        return 1
    cp = policy.control_plane
    from policy.servers import Replicas

    try:
        replicas = Replicas.parse(args.replicas, policy.replicas) if args.replicas else None
    except ValueError as exc:
        print(f"--replicas: {exc}", file=sys.stderr)
        return 2
    from runtime.admin_auth import AdminAuthError, admin_tls, admin_token

    try:
        token = admin_token(os.environ)
        tls = admin_tls(os.environ)
    except AdminAuthError as exc:
        print(f"tokenweir: {exc}", file=sys.stderr)
        return 2
    settings = ControlPlaneSettings(
        args.config, args.xds or cp.xds, args.metrics or cp.metrics, cp.debounce, replicas,
        redis_url=args.redis_url, admin_token=token, admin_tls=tls,
    )  # fmt: skip

    from runtime.process import run, serve
    from tokenweir.check import reloader_prepare, service_issues

    plane = ControlPlane(settings, check=service_issues, build_worker=reloader_prepare)
    drain = args.drain_timeout if args.drain_timeout is not None else cp.drain_timeout

    def ready() -> str:
        return (
            f"control plane: xDS {settings.xds.host}:{plane.xds_port}, "
            f"metrics http://{settings.metrics}/metrics"
        )

    return run(serve(plane, drain_timeout=drain, ready=ready), fast_loop=False)


if __name__ == "__main__":  # `python -m tokenweir.cli`: how `up` starts control-plane replicas
    sys.exit(main())
