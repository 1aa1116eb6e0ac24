"""Where file bytes live: a small interface and its default, a directory.

The directory may be a shared volume (every API server and runner of the mesh mounts it). An
object store needs the same four calls (docs/batch.md "Object stores"): a streamed put that
becomes visible whole or not at all, a read by id, a delete, and tenant-scoped names.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

from batch_service.errors import StoreError

__all__ = ["DirectoryStore", "FileStore"]


class FileStore(Protocol):
    async def put(self, tenant: str, file_id: str, chunks: AsyncIterator[bytes]) -> int:
        """Store the bytes of ``chunks`` whole (readers never see part); returns their count."""
        ...

    async def get(self, tenant: str, file_id: str) -> bytes: ...

    async def delete(self, tenant: str, file_id: str) -> None: ...


class DirectoryStore:
    """``<root>/<tenant>/<file id>``; written to a temporary name, then renamed (atomic)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, tenant: str, file_id: str) -> Path:
        for part in (tenant, file_id):
            if not part or "/" in part or part.startswith("."):
                raise StoreError(f"not a storable name: {part!r}")
        return self.root / tenant / file_id

    async def put(self, tenant: str, file_id: str, chunks: AsyncIterator[bytes]) -> int:
        path = self._path(tenant, file_id)
        tmp = path.with_name(f".{file_id}.{secrets.token_hex(4)}.part")
        size = 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as f:
                async for chunk in chunks:
                    f.write(chunk)
                    size += len(chunk)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        except OSError as exc:
            raise StoreError(f"cannot write {path}: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return size

    async def get(self, tenant: str, file_id: str) -> bytes:
        try:
            return self._path(tenant, file_id).read_bytes()
        except OSError as exc:
            raise StoreError(f"cannot read file {file_id}: {exc}") from exc

    async def delete(self, tenant: str, file_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(tenant, file_id).unlink()
