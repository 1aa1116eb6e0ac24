"""The ``cluster`` flag of a Redis URL is taken off without changing the rest of the URL."""

from __future__ import annotations

import pytest

from runtime.redis_connect import _split_cluster_flag


@pytest.mark.parametrize(
    ("url", "clean", "flag"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", None),
        ("unix:///tmp/tw/redis.sock", "unix:///tmp/tw/redis.sock", None),  # kept as given
        ("unix:///tmp/tw/redis.sock?db=2", "unix:///tmp/tw/redis.sock?db=2", None),
        ("redis://h:1/0?cluster=1", "redis://h:1/0", True),
        ("redis://h:1/0?cluster=no&ssl_cert_reqs=none", "redis://h:1/0?ssl_cert_reqs=none", False),
        ("unix:///tmp/tw/redis.sock?cluster=0", "unix:///tmp/tw/redis.sock", False),
        ("rediss://u:p@h:1/0?cluster=true", "rediss://u:p@h:1/0", True),
    ],
)
def test_cluster_flag_is_split_off(url: str, clean: str, flag: bool | None) -> None:
    assert _split_cluster_flag(url) == (clean, flag)
