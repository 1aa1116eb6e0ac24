"""Watch the policy file (and the endpoint files it names); publish snapshots on change.

Runs on the shared :class:`runtime.watcher.PolicyWatcher`: loading, the services' build check
(injected: the core imports no service), rendering and the consistency check of every snapshot
run in a worker thread; publishing into the cache is the only step on the event loop. A bad
edit is rejected with every problem logged as ``file:line: key.path: message``, counted in
``tokenweir_config_reloads_total{result="error"}``, and the last good snapshots keep serving.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from controlplane.policy import Issue, Policy, PolicyError, endpoint_files, load_policy
from controlplane.translate.render import Resources, render
from controlplane.xds.cache import SnapshotCache
from controlplane.xds.errors import InconsistentSnapshotError
from controlplane.xds.snapshot import Snapshot
from runtime.watcher import Loaded, PolicyWatcher, ReloadMetrics

__all__ = ["PolicyCheck", "ReloadResult", "Reloader", "snapshots_for"]

log = logging.getLogger("tokenweir.reloader")

PolicyCheck = Callable[[Policy, Path], list[Issue]]


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    problems: tuple[str, ...] = ()
    versions: tuple[tuple[str, str], ...] = ()


def snapshots_for(groups: dict[str, Resources]) -> dict[str, Snapshot]:
    """One snapshot per node group; the version is a hash of the content (stable across restarts)."""
    out = {}
    for group, res in groups.items():
        digest = hashlib.sha256()
        for type_url in sorted(res):
            for name in sorted(res[type_url]):
                digest.update(type_url.encode())
                digest.update(name.encode())
                digest.update(res[type_url][name].SerializeToString(deterministic=True))
        out[group] = Snapshot(digest.hexdigest()[:12], {t: dict(v) for t, v in res.items()})
    return out


@dataclass(frozen=True)
class _Built:
    policy: Policy
    snapshots: dict[str, Snapshot]


class Reloader:
    """Loads the policy, renders it, and publishes consistent snapshots into ``cache``.

    ``check(policy, path)`` (optional) lists problems the services' builders find: the CLI
    passes :func:`controlplane.check.service_issues`, so a policy the filter server or the
    rate-limit service would refuse is refused here too.
    """

    def __init__(
        self,
        path: Path,
        cache: SnapshotCache,
        *,
        registry: CollectorRegistry,
        debounce: float = 0.1,
        poll_interval: float = 0.1,
        on_policy: Callable[[Policy], None] | None = None,
        check: PolicyCheck | None = None,
        transform: Callable[[str, Snapshot], Snapshot] | None = None,
        adjust: Callable[[Policy], Policy] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path.resolve()
        self.cache = cache
        self.on_policy = on_policy
        self.check = check
        self.transform = transform  # applied to each group's snapshot (saturation marks in EDS)
        self.adjust = adjust  # applied to every loaded policy (`up --replicas` overrides)
        self.policy: Policy | None = None
        self.watcher: PolicyWatcher[_Built] = PolicyWatcher(
            self.path,
            load=self._build,
            apply=self._publish,
            metrics=ReloadMetrics(registry),
            log=log,
            poll_interval=poll_interval,
            debounce=debounce,
            clock=clock,
        )

    def _build(self, path: Path) -> Loaded[_Built]:
        """Everything but publishing (runs in a worker thread)."""
        policy = load_policy(path)
        if self.adjust is not None:
            policy = self.adjust(policy)
        if self.check is not None:
            issues = self.check(policy, path)
            if issues:
                raise PolicyError(issues)
        snaps = snapshots_for(render(policy))
        try:
            for group, snap in snaps.items():  # check all before publishing any
                self.cache.check(group, snap)
        except InconsistentSnapshotError as exc:
            raise PolicyError(
                [Issue(str(path), 0, "", f"rendered config is inconsistent: {exc}")]
            ) from exc
        return Loaded(_Built(policy, snaps), tuple(endpoint_files(policy, path.parent)))

    def _publish(self, built: _Built) -> bool:
        snaps = built.snapshots
        if self.transform is not None:  # on the event loop thread, where the marks change
            snaps = {g: self.transform(g, snap) for g, snap in snaps.items()}
        changed = [
            g
            for g, s in snaps.items()
            if (old := self.cache.get(g)) is None or old.version != s.version
        ]
        for group in changed:
            self.cache.set_snapshot(group, snaps[group])
        self.policy = built.policy
        if changed:
            log.info(
                "policy %s applied: %s",
                self.path,
                ", ".join(f"{g}@{snaps[g].version}" for g in changed),
            )
        if self.on_policy is not None:
            self.on_policy(built.policy)
        return bool(changed)

    def _result(self, ok: bool, problems: tuple[str, ...]) -> ReloadResult:
        versions = tuple((g, s.version) for g, s in sorted(self.cache.groups().items()))
        return ReloadResult(ok, problems, versions if ok else ())

    def reload(self) -> ReloadResult:
        """Load and publish now, in this thread. Keeps serving the last good snapshots on any
        error."""
        out = self.watcher.reload_now()
        return self._result(out.ok, out.problems)

    async def reload_async(self) -> ReloadResult:
        """The same, with loading and rendering in a worker thread."""
        out = await self.watcher.reload()
        return self._result(out.ok, out.problems)

    async def start(self) -> ReloadResult:
        """Load once (the result says whether it worked), then watch in the background."""
        result = await self.reload_async()
        self.watcher.start()
        return result

    async def aclose(self) -> None:
        await self.watcher.aclose()
