"""``tokenweir status``: what the running control plane decided about canaries (and why).

Reads ``GET /api/v1/canary`` on the control plane's metrics address (``-c mesh.yaml`` takes it
from ``control_plane.metrics``; ``--control-plane host:port`` names it). Exit status 0, or 1
when the control plane cannot be reached; ``--json`` prints the raw answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from controlplane.policy import Address

__all__ = ["format_status", "register"]


def register(sub: Any) -> None:
    s = sub.add_parser("status", help="canary weights and automatic rollbacks of a running mesh")
    s.add_argument("-c", "--config", type=Path, help="policy file (for control_plane.metrics)")
    s.add_argument(
        "--control-plane", type=Address.parse, help="the control plane's metrics host:port"
    )
    s.add_argument("--json", action="store_true", help="print the API's JSON")
    s.set_defaults(func=_status)


def format_status(pools: dict[str, Any]) -> str:
    if not pools:
        return "no pool has a canary"
    lines = [f"{'pool':<16} {'state':<12} {'weight':>6} {'policy':>6}  reason"]
    for name, p in sorted(pools.items()):
        reason = p.get("reason") or p.get("breaching") or ""
        lines.append(
            f"{name:<16} {p['state']:<12} {p['weight']:>6} {p['configured_weight']:>6}  {reason}"
        )
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    addr = args.control_plane
    if addr is None:
        from controlplane.cli import load_or_report

        policy = load_or_report(args.config) if args.config else None
        if policy is None:
            print("give -c mesh.yaml or --control-plane host:port", file=sys.stderr)
            return 2
        addr = policy.control_plane.metrics
    url = f"http://{addr}/api/v1/canary"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            answer = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"cannot read {url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(answer, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(format_status(answer.get("pools", {})))
    return 0
