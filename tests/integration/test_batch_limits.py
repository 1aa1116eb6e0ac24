"""The batch API's per-tenant limits and refusals, on a real Redis (issue 41): files, bytes and
jobs in flight over their limits get 429 and store nothing; an oversized upload 413; a call
without the gateway's tenant header 401; cancelling a final batch 409."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from batch_service.api import TENANT_HEADER, ApiSettings, BatchApi
from batch_service.files import DirectoryStore
from batch_service.records import Records
from policy.batch import BatchLimits, BatchPolicy
from runtime.redis_connect import connect_redis
from tests.integration.batch_jobs import EP, chat_lines

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
async def api(tmp_path: Path, redis_port: int) -> AsyncIterator[tuple[TestClient, Path]]:
    redis = await connect_redis(f"redis://127.0.0.1:{redis_port}/0", timeout=2.0)
    policy = BatchPolicy(
        service="s", gateway="g", pool="p", max_file_bytes=4096,
        limits=BatchLimits(files=3, bytes=5000, jobs_in_flight=1),
    )  # fmt: skip
    app = web.Application()
    store = tmp_path / "files"
    handler = BatchApi(
        ApiSettings(policy, frozenset({"m"})), Records(redis), DirectoryStore(store),
        clock=time.time, registry=CollectorRegistry(),
    )  # fmt: skip
    app.add_routes(handler.routes())
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield client, store
    finally:
        await client.close()
        await redis.aclose()


def form(data: bytes, purpose: str = "batch") -> aiohttp.FormData:
    f = aiohttp.FormData()
    f.add_field("purpose", purpose)
    f.add_field("file", data, filename="in.jsonl", content_type="application/jsonl")
    return f


async def test_limits_and_refusals(api: tuple[TestClient, Path]) -> None:
    client, store = api
    h = {TENANT_HEADER: f"t{secrets.token_hex(4)}", "authorization": "Bearer k"}
    r = await client.post("/v1/files", data=form(b"x"))
    assert r.status == 401  # not through the gateway: no tenant
    r = await client.post("/v1/files", data=form(b"x" * 5000), headers=h)
    assert r.status == 413 and (await r.json())["error"]["code"] == "file_too_large"
    r = await client.post("/v1/files", data=form(b"x", purpose="fine-tune"), headers=h)
    assert r.status == 400 and (await r.json())["error"]["param"] == "purpose"
    line = chat_lines(1, "a")
    ids = []
    for size in (line, b"y" * 4000):
        r = await client.post("/v1/files", data=form(size), headers=h)
        assert r.status == 200, await r.text()
        ids.append((await r.json())["id"])
    r = await client.post("/v1/files", data=form(b"z" * 1000), headers=h)  # 5000+ bytes in all
    assert r.status == 429 and "5000 bytes" in (await r.json())["error"]["message"]
    r = await client.post("/v1/files", data=form(b"z"), headers=h)
    assert r.status == 200
    r = await client.post("/v1/files", data=form(b"w"), headers=h)  # a fourth file
    assert r.status == 429 and "3 files" in (await r.json())["error"]["message"]
    kept = sorted(p.name for p in store.rglob("*") if p.is_file())
    assert len(kept) == 3  # nothing refused was kept
    r = await client.get("/v1/files?purpose=batch", headers=h)
    assert len((await r.json())["data"]) == 3
    r = await client.delete(f"/v1/files/{ids[1]}", headers=h)
    assert (await r.json())["deleted"] is True
    r = await client.post("/v1/files", data=form(b"v" * 1000), headers=h)  # room again
    assert r.status == 200

    create = {
        "input_file_id": ids[0],
        "endpoint": EP,
        "completion_window": "24h",
    }
    r = await client.post("/v1/batches", json=create, headers=h)
    first = await r.json()
    assert r.status == 200 and first["status"] == "validating", first
    assert first["request_counts"] == {"total": 1, "completed": 0, "failed": 0}
    r = await client.post("/v1/batches", json=create, headers=h)  # one in flight at most
    assert r.status == 429 and (await r.json())["error"]["code"] == "batch_limit_exceeded"
    r = await client.post("/v1/batches", json={**create, "endpoint": "/v1/embeddings"}, headers=h)
    assert r.status == 400 and (await r.json())["error"]["param"] == "endpoint"
    r = await client.post("/v1/batches", json={**create, "completion_window": "1h"}, headers=h)
    assert r.status == 400
    r = await client.post(f"/v1/batches/{first['id']}/cancel", headers=h)
    assert (await r.json())["status"] == "cancelling"
    other = {TENANT_HEADER: "someone-else"}
    r = await client.get(f"/v1/batches/{first['id']}", headers=other)
    assert r.status == 404  # tenants see only their own
    # an invalid file fails at once (not in flight), and a final batch cannot be cancelled
    r = await client.post("/v1/files", data=form(b"{broken\n"), headers=h)
    assert r.status == 429  # the 3-file limit again: delete one first
    await client.delete(f"/v1/files/{ids[0]}", headers=h)
    r = await client.post("/v1/files", data=form(b"{broken\n"), headers=h)
    bad = await client.post(
        "/v1/batches", json={**create, "input_file_id": (await r.json())["id"]}, headers=h
    )
    failed = await bad.json()
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["line"] == 1
    r = await client.post(f"/v1/batches/{failed['id']}/cancel", headers=h)
    assert r.status == 409 and (await r.json())["error"]["code"] == "batch_not_cancellable"
