"""``tokenweir up``'s batch part: one batch API server on each endpoint of the policy's batch
service and ``batch.runner.replicas`` runners (docs/batch.md). Both restart like every child."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from policy import Address
from runtime.children import Child

if TYPE_CHECKING:
    from policy.model import Policy


class Mesh(Protocol):
    """What the batch processes need of :class:`tokenweir.up.Mesh` (a protocol: ``up`` imports
    this module)."""

    policy: Policy
    config: Path
    run_dir: Path
    state_dir: Path | None
    lines: list[str]

    async def _spawn(self, child: Child, addr: Address, *, service: bool = False) -> None: ...


__all__ = ["files_dir", "start_batch"]


def files_dir(mesh: Mesh) -> Path:
    """The file store: ``batch.files_dir`` (relative to the policy), else ``batch-files`` in the
    state folder (kept across runs), else in the run folder."""
    b = mesh.policy.batch
    assert b is not None
    if b.files_dir is not None:
        return mesh.config.parent / b.files_dir
    return (mesh.state_dir or mesh.run_dir) / "batch-files"


async def start_batch(mesh: Mesh) -> None:
    b = mesh.policy.batch
    if b is None:
        return
    # the Redis URL (with its password) reaches the children in TOKENWEIR_REDIS_URL, as it
    # reaches every service `up` starts (Mesh._spawn), never on a command line
    common = ["--policy", str(mesh.config), "--files-dir", str(files_dir(mesh))]
    for i, addr in enumerate(mesh.policy.services[b.service].endpoints):
        argv = [sys.executable, "-m", "batch_service", "api", *common, "--listen", str(addr)]
        child = Child(f"batch-api#{i}", argv, mesh.run_dir / f"batch-api-{i}.log")
        await mesh._spawn(child, addr, service=True)
        mesh.lines.append(f"batch API#{i}     http://{addr}/v1/batches  pid {child.pid}")
    for i in range(b.runner.replicas):
        port = b.runner.metrics_port + i
        argv = [
            sys.executable, "-m", "batch_service", "runner", *common,
            "--index", str(i), "--metrics-port", str(port),
        ]  # fmt: skip
        child = Child(f"batch-runner#{i}", argv, mesh.run_dir / f"batch-runner-{i}.log")
        await mesh._spawn(child, Address("127.0.0.1", port), service=True)
        mesh.lines.append(
            f"batch runner#{i}  metrics http://127.0.0.1:{port}/metrics  pid {child.pid}"
        )
