from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import redis_server


@pytest.fixture(scope="session")
def redis_port() -> Iterator[int]:
    """A private redis-server for the whole test session (tests flush what they use)."""
    with redis_server() as port:
        yield port
