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
    _phase_marks_written_in_their_files(items)


PHASE_MARKS = ("serial", "alone")  # scripts/run-tests.sh finds their files by the text


def _phase_marks_written_in_their_files(items: list[pytest.Item]) -> None:
    """scripts/run-tests.sh collects the serial and alone phases from the files that spell
    ``pytest.mark.serial`` / ``pytest.mark.alone`` (collecting the whole suite to select a
    dozen tests cost ~10 CPU-s a phase). A test given such a mark some other way would run in
    no phase: refuse it here, in every collection."""
    texts: dict[str, str] = {}
    for item in items:
        for name in PHASE_MARKS:
            if item.get_closest_marker(name) is None:
                continue
            path = str(item.path)
            if path not in texts:
                texts[path] = item.path.read_text()
            if f"pytest.mark.{name}" not in texts[path]:
                raise pytest.UsageError(
                    f"{item.nodeid}: marked {name} without `pytest.mark.{name}` in its file; "
                    "scripts/run-tests.sh would run it in no phase"
                )
