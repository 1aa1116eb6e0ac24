from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.helpers import redis_server

# Policy builds run at SCHED_IDLE in a lowest-weight group (runtime/buildworker.py): with the
# suite's workers keeping both cores busy they got no CPU, and reloads the tests wait for took
# minutes. Here they compete as equals; tests/runtime/test_buildworker.py checks the lowering.
os.environ.setdefault("TOKENWEIR_BUILD_NICE", "0")


@pytest.fixture(scope="session")
def redis_port() -> Iterator[int]:
    """A private redis-server for the whole test session (tests flush what they use)."""
    with redis_server() as port:
        yield port
