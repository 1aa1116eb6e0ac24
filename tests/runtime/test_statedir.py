"""runtime.statedir: where the CLIs find the running mesh's Redis, and the state-dir lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.statedir import (
    DEFAULT_REDIS,
    MeshInfo,
    StateDirBusy,
    StateLock,
    default_state_dir,
    find_redis,
    read_mesh_info,
    remove_mesh_info,
    unreachable,
    write_mesh_info,
)


def test_default_state_dir_is_next_to_the_policy(tmp_path: Path) -> None:
    assert (
        default_state_dir(tmp_path / "a" / "mesh.yaml") == tmp_path / "a" / ".tokenweir" / "state"
    )


def test_flag_then_running_mesh_then_policy_then_default(tmp_path: Path) -> None:
    info = MeshInfo(pid=os.getpid(), redis_url="redis://127.0.0.1:4242/0", policy="p")
    write_mesh_info(tmp_path, info)
    assert find_redis("redis://x:1/0", tmp_path, "redis://p:2/0").url == "redis://x:1/0"
    found = find_redis(None, tmp_path, "redis://p:2/0")
    assert found.url == "redis://127.0.0.1:4242/0" and str(os.getpid()) in found.source
    remove_mesh_info(tmp_path)
    assert find_redis(None, tmp_path, "redis://p:2/0").url == "redis://p:2/0"
    fallback = find_redis(None, tmp_path, None)
    assert fallback.url == DEFAULT_REDIS and str(tmp_path) in fallback.source


def test_a_mesh_file_left_by_a_dead_up_or_unreadable_is_ignored(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_mesh_info(tmp_path, MeshInfo(pid=dead.pid, redis_url="redis://gone:1/0", policy="p"))
    assert read_mesh_info(tmp_path) is None
    (tmp_path / "mesh.json").write_text("{not json")
    assert read_mesh_info(tmp_path) is None
    assert find_redis(None, tmp_path, None).url == DEFAULT_REDIS


def test_unreachable_names_the_url_its_source_and_the_flag() -> None:
    target = find_redis(None, None, "redis://127.0.0.1:1/0")
    msg = unreachable(target, ConnectionRefusedError("Connection refused"))
    assert "redis://127.0.0.1:1/0" in msg and "ratelimit.redis_url" in msg
    assert "--redis-url" in msg and "Connection refused" in msg


def test_one_up_per_state_dir(tmp_path: Path) -> None:
    first, second = StateLock(tmp_path / "s"), StateLock(tmp_path / "s")
    first.acquire()
    with pytest.raises(StateDirBusy, match="--state-dir"):
        second.acquire()
    first.release()
    second.acquire()
    second.release()
