"""runtime.ports / runtime.children: waiting for a port fails early when the process died."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.children import Child, ChildError, wait_child_port
from runtime.errors import PortTimeout
from runtime.ports import wait_port


async def test_wait_port_fails_at_once_when_the_process_is_gone() -> None:
    with pytest.raises(ChildError, match=r"exited before listening on 127\.0\.0\.1:9"):
        await wait_port("127.0.0.1", 9, alive=lambda: False, describe=lambda: "last log line")


async def test_wait_port_times_out_as_port_timeout() -> None:
    with pytest.raises(PortTimeout):
        await wait_port("127.0.0.1", 9, timeout=0)


async def test_wait_child_port_names_the_child_and_shows_its_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("boom: bad config\n")
    child = Child("ratelimit", ["true"], log)  # never started: not alive
    with pytest.raises(ChildError, match=r"ratelimit exited with None:\nboom: bad config"):
        await wait_child_port("127.0.0.1", 9, child)
