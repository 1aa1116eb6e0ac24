"""Build, offline, everything every service builds from a policy: what validates never breaks one.

The control plane's core (policy, translate, xds) imports no service. This module sits at the
CLI level (``tokenweir validate``, ``serve``, ``up``) and does import them, to run the very
builders the services run on a reload:

- the filter server's plugin chains (:func:`filters.registry.build_routes` with default
  services, no Redis), plugin by plugin so each refusal names its key path;
- the rate-limit service's decider settings and quota tables (every tenant's and service's
  effective quotas);
- the emulated pools' profiles (``tokenweir up`` starts those emulators);
- the translation to Envoy resources and the snapshot consistency check.

:func:`service_issues` is what the running control plane's reloader is given (it renders and
checks snapshots itself): a policy whose plugin settings the filter server would reject is then
refused by the control plane too, and Envoy keeps routes the filter server knows.
"""

from __future__ import annotations

import time
from pathlib import Path

from controlplane.reloader import Prepared, prepare
from policy import Issue, Policy, PolicyError, key_lines, load_policy
from runtime.watcher import Loaded

__all__ = ["check_file", "reloader_prepare", "service_issues", "service_problems"]


def service_problems(policy: Policy) -> list[tuple[str, str]]:
    """``(key.path, message)`` for everything a service's builder refuses in ``policy``."""
    return _filter_problems(policy) + _ratelimit_problems(policy) + _emulator_problems(policy)


def service_issues(policy: Policy, path: Path) -> list[Issue]:
    """:func:`service_problems` as ``file:line: key.path: message`` issues."""
    problems = service_problems(policy)
    if not problems:
        return []
    line = key_lines(path)
    return [Issue(str(path), line(key), key, msg) for key, msg in problems]


def reloader_prepare(path: Path) -> Loaded[Prepared]:
    """The control plane's reload in its build worker process: load, the services' check, render."""
    return prepare(path, service_issues)


def check_file(path: Path) -> tuple[Policy | None, list[Issue]]:
    """Load ``path`` and build everything from it; the policy is None when it does not load."""
    try:
        policy = load_policy(path)
    except PolicyError as exc:
        return None, list(exc.issues)
    issues = service_issues(policy, path)
    from controlplane.reloader import snapshots_for
    from controlplane.translate.render import render
    from controlplane.xds.errors import InconsistentSnapshotError

    try:
        for snap in snapshots_for(render(policy)).values():
            snap.check()
    except InconsistentSnapshotError as exc:
        issues.append(Issue(str(path), 0, "", f"rendered config is inconsistent: {exc}"))
    return policy, issues


def _filter_problems(policy: Policy) -> list[tuple[str, str]]:
    from filters.registry import build_routes, load_factory
    from filters.services import default_services

    services = default_services(policy, time.monotonic)
    out: list[tuple[str, str]] = []
    for gname, gateway in policy.gateways.items():
        for i, route in enumerate(gateway.routes):
            if route.filters is None or not route.filters.enabled:
                continue
            for j, ref in enumerate(route.filters.plugins):
                key = f"gateways.{gname}.routes[{i}].filters.plugins[{j}]"
                try:
                    load_factory(ref.name)(dict(ref.settings), services)
                except Exception as exc:  # a user's factory may raise anything: report it
                    out.append((key, f"the filter server refuses plugin {ref.name!r}: {exc}"))
    if out:
        return out
    try:
        build_routes(policy, services)
    except Exception as exc:  # anything the chain builder refuses beyond single plugins
        out.append(("gateways", f"the filter server refuses the plugin chains: {exc}"))
    return out


def _ratelimit_problems(policy: Policy) -> list[tuple[str, str]]:
    from quota.config import effective_quotas, service_defaults, tenant_defaults
    from ratelimit_service.server import decider_settings

    out: list[tuple[str, str]] = []
    if policy.ratelimit is not None:
        try:
            decider_settings(policy.ratelimit)
        except (ValueError, TypeError) as exc:
            out.append(("ratelimit", f"the rate-limit service refuses its settings: {exc}"))
    subjects = [("tenants", n, tenant_defaults(policy, n)) for n in policy.tenants]
    subjects += [("services", n, service_defaults(policy, n)) for n in policy.services]
    for section, name, defaults in subjects:
        problems = effective_quotas(defaults, {}).problems
        if problems:
            msg = "; ".join(problems)
            out.append((f"{section}.{name}", f"the rate-limit service refuses its quotas: {msg}"))
    return out


def _emulator_problems(policy: Policy) -> list[tuple[str, str]]:
    """Pools ``tokenweir up`` would start as emulators with a profile the emulator lacks."""
    from backends.profiles import profile_names

    known = profile_names()
    return [
        (
            f"pools.{name}.emulated.profile",
            f"unknown emulator profile {pool.emulated.profile!r}; known: {', '.join(known)}",
        )
        for name, pool in policy.pools.items()
        if pool.emulated is not None and pool.emulated.profile not in known
    ]
