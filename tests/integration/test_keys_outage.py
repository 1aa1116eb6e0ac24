"""A real Redis outage under the filter server's key store (real redis-server, stopped mid-run):
the last answer per key holds (a Redis-issued key keeps working, a revoked policy key stays
revoked), a key nobody knows gets 503 rather than 401."""

from __future__ import annotations

import pytest

from filters.errors import KeyServiceUnavailable
from filters.keys import KeyInfo, KeyStore, revoke_key, set_key
from filters.redis_pool import redis_client
from tests.helpers import redis_server

pytestmark = pytest.mark.integration


async def test_outage_keeps_the_last_known_answers() -> None:
    clock = [1000.0]
    fallbacks: list[str] = []
    with redis_server() as port:
        client = redis_client(f"redis://127.0.0.1:{port}/0", timeout=0.5)
        ks = KeyStore(
            {"policy-key-1": KeyInfo("acme", "pro")},
            client,
            clock=lambda: clock[0],
            on_fallback=fallbacks.append,
            io_timeout=0.5,
        )
        await set_key(client, "issued-key-1", "acme")
        await revoke_key(client, "policy-key-1")
        assert await ks.lookup("issued-key-1") == KeyInfo("acme", None)
        assert await ks.lookup("policy-key-1") is None
        await ks.sync_tombstones()
    # Redis is gone (the context stopped it): connections are refused from now on
    try:
        clock[0] += 60.0
        for _ in range(20):
            assert await ks.lookup("issued-key-1") == KeyInfo("acme", None)
            assert await ks.lookup("policy-key-1") is None
        with pytest.raises(KeyServiceUnavailable):
            await ks.lookup("never-seen-key")
        assert set(fallbacks) == {"last_known", "unavailable"}
    finally:
        await ks.aclose()
        await client.aclose()
