"""``tokenweir status``: what the running control plane decided about canaries (and why), and
how each shadow pool compares with its primary.

Reads ``GET /api/v1/canary`` and ``GET /api/v1/shadow`` on the control plane's metrics address
(``-c mesh.yaml`` takes it from ``control_plane.metrics``; ``--control-plane host:port`` names
it). The operator surface's own settings say how (runtime.admin_auth): with
``TOKENWEIR_ADMIN_TLS_CERT``/``_KEY`` set it speaks HTTPS, checks the server against
``TOKENWEIR_ADMIN_CLIENT_CA`` (the mesh CA; the system bundle without one) and presents that
certificate, which the control plane takes instead of the token; the token
(``TOKENWEIR_ADMIN_TOKEN[_FILE]``) is sent when set. Exit status 0, 1 when the control plane
cannot be reached, 2 on bad settings; ``--json`` prints the raw answer.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

from policy import Address
from runtime.admin_auth import AdminAuthError, AdminTls, admin_tls, admin_token
from wire.jsontypes import JsonObject, JsonValue

__all__ = ["format_shadow", "format_status", "register", "unreachable"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("status", help="canary weights and automatic rollbacks of a running mesh")
    s.add_argument("-c", "--config", type=Path, help="policy file (for control_plane.metrics)")
    s.add_argument(
        "--control-plane", type=Address.parse, help="the control plane's metrics host:port"
    )
    s.add_argument("--json", action="store_true", help="print the API's JSON")
    s.set_defaults(func=_status)


def _object(value: JsonValue) -> JsonObject:
    return value if isinstance(value, dict) else {}


def format_status(pools: JsonObject) -> str:
    """``pools`` of ``GET /api/v1/canary``."""
    if not pools:
        return "no pool has a canary"
    lines = [f"{'pool':<16} {'state':<12} {'weight':>6} {'policy':>6}  reason"]
    for name in sorted(pools):
        p = _object(pools[name])
        reason = p.get("reason") or p.get("breaching") or ""
        lines.append(
            f"{name:<16} {p['state']:<12} {p['weight']:>6} {p['configured_weight']:>6}  {reason}"
        )
    return "\n".join(lines)


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def format_shadow(routes: JsonObject) -> str:
    """``routes`` of ``GET /api/v1/shadow``."""
    if not routes:
        return "no route mirrors to a shadow pool"
    keys = ("requests", "aborted", "completion_tokens_per_request", "ttft_p95_s", "tbt_p95_s")
    lines = [f"{'route':<16} {'side':<8} " + " ".join(f"{k:>14.14}" for k in keys)]
    for name in sorted(routes):
        r = _object(routes[name])
        for side in ("primary", "shadow"):
            pool = r[f"{side}_pool"]
            stats = _object(r[side])
            vals = " ".join(f"{_fmt(stats[k]):>14}" for k in keys)
            lines.append(f"{name:<16} {side:<8} {vals}  ({pool})")
    return "\n".join(lines)


def unreachable(args: argparse.Namespace, base: str, exc: BaseException) -> str:
    """Why the control plane at ``base`` could not be read, and what to do about it."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        where = (
            "--control-plane" if args.control_plane else f"control_plane.metrics of {args.config}"
        )
        start = f"tokenweir up -c {args.config or 'mesh.yaml'}"
        return f"no mesh is running: nothing listens on {base} ({where}); start one with `{start}`"
    return f"cannot read {base}: {reason}"


def client_context(tls: AdminTls) -> ssl.SSLContext:
    """The CLI's end of the operator surface's HTTPS: the server checked against the mesh CA
    (``TOKENWEIR_ADMIN_CLIENT_CA``) and this certificate presented, so that a control plane
    taking client certificates lets the CLI in without the token."""
    ctx = tls.client()
    ctx.load_cert_chain(tls.cert, tls.key)
    return ctx


def _get(url: str, context: ssl.SSLContext | None = None) -> JsonValue:
    """GET JSON, with the admin token when one is set (runtime.admin_auth)."""
    token = admin_token(os.environ)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=5, context=context) as r:
        answer: JsonValue = json.loads(r.read())
        return answer


def _status(args: argparse.Namespace) -> int:
    addr = args.control_plane
    if addr is None:
        from tokenweir.admin_args import load_or_report

        policy = load_or_report(args.config) if args.config else None
        if policy is None:
            print("give -c mesh.yaml or --control-plane host:port", file=sys.stderr)
            return 2
        addr = policy.control_plane.metrics
    try:
        tls = admin_tls(os.environ)
        context = client_context(tls) if tls is not None else None
        admin_token(os.environ)  # a token file that cannot be read is said before any call
    except (AdminAuthError, OSError, ssl.SSLError) as exc:
        print(f"tokenweir status: {exc}", file=sys.stderr)
        return 2
    base = f"{'https' if tls is not None else 'http'}://{addr}"
    try:
        canary = _get(base + "/api/v1/canary", context)
        shadow = _get(base + "/api/v1/shadow?refresh=1", context)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"tokenweir status: {unreachable(args, base, exc)}", file=sys.stderr)
        return 1
    if args.json:
        json.dump({"canary": canary, "shadow": shadow}, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(format_status(_object(_object(canary).get("pools", {}))))
        print()
        print(format_shadow(_object(_object(shadow).get("routes", {}))))
    return 0
