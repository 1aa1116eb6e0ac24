"""Watch the policy file (and the endpoint files it names); publish snapshots on change.

A bad edit is rejected with every problem logged as ``file:line: key.path: message``, counted
in ``tokenweir_config_reloads_total{result="error"}``, and the last good snapshots keep serving.
Changes are debounced: a burst of writes (an editor's save, a launcher's rewrite) becomes one
reload.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge

from controlplane.policy import Policy, PolicyError, endpoint_files, load_policy
from controlplane.translate.render import Resources, render
from controlplane.xds.cache import SnapshotCache
from controlplane.xds.errors import InconsistentSnapshotError
from controlplane.xds.snapshot import Snapshot
from runtime.tasks import stop_task

__all__ = ["ReloadResult", "Reloader", "snapshots_for"]

log = logging.getLogger("tokenweir.reloader")


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


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reloads = Counter(
            "tokenweir_config_reloads",
            "Policy reloads by result (ok, error, unchanged)",
            ["result"],
            registry=registry,
        )
        self.last_ok = Gauge(
            "tokenweir_config_last_reload_success_timestamp_seconds",
            "Unix time of the last policy reload that was applied",
            registry=registry,
        )
        self.last_error = Gauge(
            "tokenweir_config_last_reload_error",
            "1 while the file on disk is rejected (last good config serves)",
            registry=registry,
        )


def _fingerprint(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Reloader:
    """Loads the policy, renders it, and publishes consistent snapshots into ``cache``."""

    def __init__(
        self,
        path: Path,
        cache: SnapshotCache,
        *,
        registry: CollectorRegistry,
        debounce: float = 0.1,
        poll_interval: float = 0.1,
        on_policy: Callable[[Policy], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path.resolve()
        self.cache = cache
        self.debounce = debounce
        self.poll_interval = poll_interval
        self.on_policy = on_policy
        self.policy: Policy | None = None
        self._clock = clock
        self._metrics = _Metrics(registry)
        self._watched: dict[Path, tuple[int, int, int] | None] = {}
        self._task: asyncio.Task[None] | None = None

    def reload(self) -> ReloadResult:
        """Load and publish now. Keeps serving the last good snapshots on any error."""
        self._remember_files([self.path])
        try:
            policy = load_policy(self.path)
            self._remember_files([self.path, *endpoint_files(policy, self.path.parent)])
            snaps = snapshots_for(render(policy))
            for group, snap in snaps.items():  # check all before publishing any
                self.cache.check(group, snap)
        except PolicyError as exc:
            return self._reject([str(i) for i in exc.issues])
        except InconsistentSnapshotError as exc:
            return self._reject([f"{self.path}: rendered config is inconsistent: {exc}"])
        changed = [
            g
            for g, s in snaps.items()
            if (old := self.cache.get(g)) is None or old.version != s.version
        ]
        for group in changed:
            self.cache.set_snapshot(group, snaps[group])
        self.policy = policy
        self._metrics.reloads.labels("ok" if changed else "unchanged").inc()
        self._metrics.last_ok.set(self._clock())
        self._metrics.last_error.set(0)
        if changed:
            log.info(
                "policy %s applied: %s",
                self.path,
                ", ".join(f"{g}@{snaps[g].version}" for g in changed),
            )
        if self.on_policy is not None:
            self.on_policy(policy)
        return ReloadResult(True, (), tuple((g, s.version) for g, s in sorted(snaps.items())))

    def _reject(self, problems: list[str]) -> ReloadResult:
        self._metrics.reloads.labels("error").inc()
        self._metrics.last_error.set(1)
        for line in problems:
            log.error("policy rejected, last good config keeps serving: %s", line)
        return ReloadResult(False, tuple(problems))

    def _remember_files(self, files: list[Path]) -> None:
        self._watched = {f: _fingerprint(f) for f in files}

    def _changed(self) -> bool:
        return any(_fingerprint(f) != fp for f, fp in self._watched.items())

    async def start(self) -> ReloadResult:
        """Load once (the result says whether it worked), then watch in the background."""
        result = self.reload()
        self._task = asyncio.create_task(self._watch(), name="tokenweir-reloader")
        return result

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            if not self._changed():
                continue
            # Debounce: wait until the files stop changing for `debounce` seconds.
            snapshot = {f: _fingerprint(f) for f in self._watched}
            while True:
                await asyncio.sleep(self.debounce)
                now = {f: _fingerprint(f) for f in self._watched}
                if now == snapshot:
                    break
                snapshot = now
            self.reload()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await stop_task(task, log=log)  # a watcher that had crashed: one line, no traceback
