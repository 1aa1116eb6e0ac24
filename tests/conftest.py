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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """tests/integration first: it holds the suite's long files (a benchmark's smoke run takes
    minutes), and `make test` deals whole files to its workers in collection order
    (``--no-loadscope-reorder``), so they start early and the many short unit files fill the
    workers' ends. xdist's own order (most tests first) left the one-test benchmark files for
    last: in a loaded run one of them ran alone for the last 3 minutes."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/integration/"))
