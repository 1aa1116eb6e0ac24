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
from types import MappingProxyType

from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from controlplane.sds_files import write_sds_files
from controlplane.translate.render import Resources, render
from controlplane.xds.cache import SnapshotCache
from controlplane.xds.errors import InconsistentSnapshotError
from controlplane.xds.snapshot import Snapshot
from policy import Issue, Policy, PolicyError, endpoint_files, load_policy
from runtime.buildworker import Target
from runtime.watcher import InWorker, Loaded, PolicyWatcher, ReloadMetrics

__all__ = ["PolicyCheck", "Prepared", "ReloadResult", "Reloader", "prepare", "snapshots_for"]

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


Resources_ = dict[str, dict[str, Message]]


@dataclass(frozen=True)
class Prepared:
    """A loaded, checked and rendered policy as plain data (sent back by the build worker)."""

    policy: Policy
    snapshots: dict[str, tuple[str, Resources_]]  # group -> (version, type URL -> name -> res)


def prepare(
    path: Path,
    check: PolicyCheck | None = None,
    adjust: Callable[[Policy], Policy] | None = None,
) -> Loaded[Prepared]:
    """Load, run ``check`` and render: the part of a reload that needs no live state (the CLI
    runs it in the build worker process with the services' check, ``tokenweir.check``)."""
    policy = load_policy(path)
    if adjust is not None:
        policy = adjust(policy)
    if check is not None:
        issues = check(policy, path)
        if issues:
            raise PolicyError(issues)
    snaps = {
        group: (snap.version, {t: dict(by_name) for t, by_name in snap.resources.items()})
        for group, snap in snapshots_for(render(policy)).items()
    }
    try:
        write_sds_files(policy)  # before any listener naming them is published
    except OSError as exc:
        raise PolicyError([Issue(str(path), 0, "tls.sds_dir", f"cannot write: {exc}")]) from exc
    return Loaded(Prepared(policy, snaps), tuple(endpoint_files(policy, path.parent)))


class Reloader:
    """Loads the policy, renders it, and publishes consistent snapshots into ``cache``.

    ``check(policy, path)`` (optional) lists problems the services' builders find: the CLI
    passes :func:`tokenweir.check.service_issues`, so a policy the filter server or the
    rate-limit service would refuse is refused here too. ``build_worker`` (a module-level
    function returning :func:`prepare`'s result; the CLI passes
    :func:`tokenweir.check.reloader_prepare`)
    moves loading, checking and rendering into a child process (:mod:`runtime.buildworker`).
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
        build_worker: Target | None = None,
    ) -> None:
        self.path = path.resolve()
        self.cache = cache
        self.on_policy = on_policy
        self.check = check
        self.transform = transform  # applied to each group's snapshot (saturation marks in EDS)
        self.adjust = adjust  # applied to every loaded policy (`up --replicas` overrides)
        self.policy: Policy | None = None
        # ``adjust`` is this process's (``up --replicas``): with it, the build stays in a thread
        load: InWorker[_Built] | Callable[[Path], Loaded[_Built]] = self._build
        if build_worker and adjust is None:
            load = InWorker(build_worker, self._finish)
        self.watcher: PolicyWatcher[_Built] = PolicyWatcher(
            self.path,
            load=load,
            apply=self._publish,
            metrics=ReloadMetrics(registry),
            log=log,
            poll_interval=poll_interval,
            debounce=debounce,
            clock=clock,
        )

    def _build(self, path: Path) -> Loaded[_Built]:
        """Everything but publishing (in a worker thread, without a build worker)."""
        loaded = prepare(path, self.check, self.adjust)
        return Loaded(self._finish(loaded.value), loaded.files)

    def _finish(self, prepared: Prepared) -> _Built:
        """The snapshots, checked against what the cache holds (before publishing any)."""
        snaps = {
            group: Snapshot(version, {t: MappingProxyType(v) for t, v in resources.items()})
            for group, (version, resources) in prepared.snapshots.items()
        }
        try:
            for group, snap in snaps.items():  # check all before publishing any
                self.cache.check(group, snap)
        except InconsistentSnapshotError as exc:
            issue = Issue(str(self.path), 0, "", f"rendered config is inconsistent: {exc}")
            raise PolicyError([issue]) from exc
        return _Built(prepared.policy, snaps)

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
        """Load once (the result says whether it worked), then watch in the background. The
        first load runs in a thread at this process's priority, not in the build worker: nothing
        is served before it (:meth:`runtime.watcher.PolicyWatcher.reload_in_thread`)."""
        out = await self.watcher.reload_in_thread()
        result = self._result(out.ok, out.problems)
        self.watcher.start()
        return result

    async def aclose(self) -> None:
        await self.watcher.aclose()
