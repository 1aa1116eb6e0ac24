"""The HTTP API: OpenAI's ``/v1/files`` and ``/v1/batches`` (docs/batch.md).

It sits behind the gateway: the ``identity`` plugin has checked the caller's key, set
``x-tokenweir-tenant`` (a client's own is stripped) and, with ``forward_authorization``,
passed the key on; the job keeps that key so the runner's requests are the tenant's own. The
server listens on loopback (or a network only the gateway reaches): it trusts that header.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass

from aiohttp import BodyPartReader, web
from prometheus_client import CollectorRegistry, Counter

from batch_service.errors import ApiError, StoreError
from batch_service.files import FileStore
from batch_service.objects import ACTIVE, batch_object, file_object, new_id
from batch_service.records import Records
from batch_service.validate import EMBEDDINGS, ENDPOINTS, parse_lines
from policy.batch import BatchPolicy
from policy.model import Policy

__all__ = ["ApiSettings", "BatchApi", "served_endpoints"]

TENANT_HEADER = "x-tokenweir-tenant"
WINDOWS = ("24h",)


@dataclass(frozen=True)
class ApiSettings:
    policy: BatchPolicy
    models: frozenset[str]  # every model a pool serves
    endpoints: tuple[str, ...] = ENDPOINTS  # what a batch may call (served_endpoints)


def served_endpoints(policy: Policy) -> tuple[str, ...]:
    """The endpoints a batch may call: chat and completions (every pool serves them), and
    ``/v1/embeddings`` where a gateway route sends that path to a pool (its ``match`` takes the
    path: ``path: /v1/embeddings`` or a prefix of it; headers aside, as the runner's own
    ``x-batch-line`` header picks the batch lane's route)."""
    routes = [r for g in policy.gateways.values() for r in g.routes if r.pool is not None]
    served = any(
        r.match.path == EMBEDDINGS
        or (r.match.prefix is not None and EMBEDDINGS.startswith(r.match.prefix))
        for r in routes
    )
    return (*ENDPOINTS, EMBEDDINGS) if served else ENDPOINTS


class BatchApi:
    def __init__(
        self,
        settings: ApiSettings,
        records: Records,
        store: FileStore,
        *,
        clock: Callable[[], float],
        registry: CollectorRegistry,
    ) -> None:
        self.s = settings
        self.records = records
        self.store = store
        self.clock = clock
        self.requests = Counter(
            "tokenweir_batch_api_requests",
            "batch API requests by operation and HTTP status",
            ["op", "code"],
            registry=registry,
        )
        self.invalid_lines = Counter(
            "tokenweir_batch_invalid_lines",
            "input lines refused when a batch was created (validation)",
            registry=registry,
        )

    def routes(self) -> list[web.RouteDef]:
        h = self._handle
        return [
            web.post("/v1/files", h("files.create", self.create_file)),
            web.get("/v1/files", h("files.list", self.list_files)),
            web.get("/v1/files/{id}", h("files.retrieve", self.get_file)),
            web.get("/v1/files/{id}/content", h("files.content", self.file_content)),
            web.delete("/v1/files/{id}", h("files.delete", self.delete_file)),
            web.post("/v1/batches", h("batches.create", self.create_batch)),
            web.get("/v1/batches", h("batches.list", self.list_batches)),
            web.get("/v1/batches/{id}", h("batches.retrieve", self.get_batch)),
            web.post("/v1/batches/{id}/cancel", h("batches.cancel", self.cancel_batch)),
        ]

    def _handle(
        self, op: str, fn: Callable[[web.Request, str], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                tenant = request.headers.get(TENANT_HEADER, "")
                if not tenant:
                    raise ApiError(
                        401, "no tenant: the batch API is served through the gateway, "
                        "with an API key", code="invalid_api_key", type_="authentication_error",
                    )  # fmt: skip
                resp: web.StreamResponse = await fn(request, tenant)
            except ApiError as exc:
                resp = web.json_response(exc.body(), status=exc.status)
            except StoreError as exc:
                err = ApiError(500, str(exc), code="file_store_error", type_="server_error")
                resp = web.json_response(err.body(), status=500)
            self.requests.labels(op, str(resp.status)).inc()
            return resp

        return handler

    # ---- files ---------------------------------------------------------------------------------
    async def create_file(self, request: web.Request, tenant: str) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "upload a file as multipart/form-data", code="invalid_request")
        reader = await request.multipart()
        purpose = filename = None
        fid, size = new_id("file"), None
        limit = self.s.policy.max_file_bytes
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "purpose":
                purpose = (await part.text()).strip()
            elif part.name == "file":
                filename = part.filename or "upload.jsonl"
                size = await self.store.put(tenant, fid, _chunks(part, limit))
            else:
                await part.release()
        if size is None:
            raise ApiError(
                400, "file: a file part is required", code="invalid_request", param="file"
            )
        if purpose != "batch":
            await self.store.delete(tenant, fid)
            raise ApiError(
                400, f"purpose: {purpose!r} is not served here; allowed: 'batch'",
                code="invalid_request", param="purpose",
            )  # fmt: skip
        meta = {
            "id": fid, "bytes": size, "created_at": int(self.clock()),
            "filename": filename or "", "purpose": "batch",
        }  # fmt: skip
        lim = self.s.policy.limits
        got = await self.records.add_file(tenant, meta, lim.files, lim.bytes)
        if got != "ok":
            await self.store.delete(tenant, fid)
            what = f"{lim.files} files" if got == "files" else f"{lim.bytes} bytes of files"
            raise ApiError(
                429, f"your tenant keeps at most {what}; delete files first",
                code="file_limit_exceeded", type_="rate_limit_error",
            )  # fmt: skip
        return web.json_response(file_object({k: str(v) for k, v in meta.items()}))

    async def _file(self, tenant: str, file_id: str) -> dict[str, str]:
        meta = await self.records.get_file(tenant, file_id)
        if meta is None:
            raise ApiError(
                404, f"No such File object: {file_id}", code="file_not_found", param="id"
            )
        return meta

    async def list_files(self, request: web.Request, tenant: str) -> web.Response:
        purpose = request.query.get("purpose")
        files = [
            file_object(m)
            for m in await self.records.list_files(tenant)
            if purpose is None or m.get("purpose") == purpose
        ]
        return web.json_response(_page(files, request))

    async def get_file(self, request: web.Request, tenant: str) -> web.Response:
        return web.json_response(file_object(await self._file(tenant, request.match_info["id"])))

    async def file_content(self, request: web.Request, tenant: str) -> web.Response:
        meta = await self._file(tenant, request.match_info["id"])
        data = await self.store.get(tenant, meta["id"])
        return web.Response(body=data, content_type="application/jsonl")

    async def delete_file(self, request: web.Request, tenant: str) -> web.Response:
        meta = await self._file(tenant, request.match_info["id"])
        if await self.records.delete_file(tenant, meta["id"]):
            await self.store.delete(tenant, meta["id"])
        return web.json_response({"id": meta["id"], "object": "file", "deleted": True})

    # ---- batches -------------------------------------------------------------------------------
    async def create_batch(self, request: web.Request, tenant: str) -> web.Response:
        try:
            req = await request.json()
        except ValueError as exc:
            raise ApiError(400, f"the body is not JSON: {exc}", code="invalid_request") from exc
        if not isinstance(req, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_request")
        unknown = sorted(set(req) - {"input_file_id", "endpoint", "completion_window", "metadata"})
        if unknown:
            raise ApiError(
                400, f"unknown parameter(s) {unknown}; allowed: input_file_id, endpoint, "
                "completion_window, metadata", code="unknown_parameter", param=unknown[0],
            )  # fmt: skip
        endpoint = req.get("endpoint")
        if endpoint not in self.s.endpoints:
            raise ApiError(
                400, f"endpoint: {endpoint!r} is not served by this mesh's pools; allowed: "
                f"{list(self.s.endpoints)}", code="invalid_value", param="endpoint",
            )  # fmt: skip
        window = req.get("completion_window")
        if window not in WINDOWS:
            raise ApiError(
                400, f"completion_window: {window!r}; allowed: {list(WINDOWS)}",
                code="invalid_value", param="completion_window",
            )  # fmt: skip
        metadata = req.get("metadata")
        if metadata is not None and not _metadata_ok(metadata):
            raise ApiError(
                400, "metadata: at most 16 string keys (64 chars) with string values (512 chars)",
                code="invalid_value", param="metadata",
            )  # fmt: skip
        meta = await self._file(tenant, str(req.get("input_file_id")))
        if meta.get("purpose") != "batch":
            raise ApiError(
                400, f"input_file_id: file {meta['id']} has purpose {meta.get('purpose')!r}, "
                "not 'batch'", code="invalid_value", param="input_file_id",
            )  # fmt: skip
        data = await self.store.get(tenant, meta["id"])
        lines, errors = parse_lines(data, str(endpoint), self.s.models, self.s.policy.max_lines)
        now = int(self.clock())
        fields: dict[str, object] = {
            "id": new_id("batch"), "endpoint": endpoint, "input_file_id": meta["id"],
            "completion_window": window, "created_at": now,
            "metadata": json.dumps(metadata) if metadata else "",
            "completed": 0, "failed": 0,
            "key": request.headers.get("authorization", ""),
        }  # fmt: skip
        if errors:
            self.invalid_lines.inc(len(errors))
            fields |= {
                "status": "failed", "failed_at": now, "total": 0,
                "errors": json.dumps([e.to_json() for e in errors]),
            }  # fmt: skip
        else:
            fields |= {
                "status": "validating", "total": len(lines),
                "expires_at": now + int(self.s.policy.completion_window),
                "model": str(lines[0].body["model"]),
            }  # fmt: skip
        lim = self.s.policy.limits.jobs_in_flight
        got = await self.records.create_job(tenant, fields, lim, active=not errors)
        if got == "jobs":
            raise ApiError(
                429, f"your tenant runs at most {lim} batches at once; wait for one to finish",
                code="batch_limit_exceeded", type_="rate_limit_error",
            )  # fmt: skip
        # the object as created (status `validating`, as OpenAI's create answers): a runner may
        # already have taken the queued job, and its later state is what retrieve is for
        return web.json_response(batch_object({k: str(v) for k, v in fields.items()}))

    async def _job(self, tenant: str, job_id: str) -> dict[str, str]:
        job = await self.records.get_job(tenant, job_id)
        if job is None:
            raise ApiError(
                404, f"No such Batch object: {job_id}", code="batch_not_found", param="id"
            )
        return job

    async def get_batch(self, request: web.Request, tenant: str) -> web.Response:
        return web.json_response(batch_object(await self._job(tenant, request.match_info["id"])))

    async def list_batches(self, request: web.Request, tenant: str) -> web.Response:
        out = []
        for jid in await self.records.list_jobs(tenant):
            job = await self.records.get_job(tenant, jid)
            if job is not None:
                out.append(batch_object(job))
        return web.json_response(_page(out, request))

    async def cancel_batch(self, request: web.Request, tenant: str) -> web.Response:
        jid = request.match_info["id"]
        await self._job(tenant, jid)
        got = await self.records.move(
            tenant, jid, ("validating", "in_progress"), "cancelling",
            {"cancelling_at": int(self.clock())},
        )  # fmt: skip
        job = await self._job(tenant, jid)
        if got != "ok" and job["status"] not in ACTIVE:
            raise ApiError(
                409, f"batch {jid} is {job['status']}: it cannot be cancelled",
                code="batch_not_cancellable",
            )  # fmt: skip
        return web.json_response(batch_object(job))


async def _chunks(part: BodyPartReader, limit: int) -> AsyncIterator[bytes]:
    total = 0
    while chunk := await part.read_chunk(256 * 1024):
        total += len(chunk)
        if total > limit:
            raise ApiError(
                413, f"file: larger than the {limit} bytes allowed (batch.max_file_bytes)",
                code="file_too_large", param="file",
            )  # fmt: skip
        yield chunk


def _metadata_ok(m: object) -> bool:
    return (
        isinstance(m, dict)
        and len(m) <= 16
        and all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in m.items()
        )
    )


def _page(items: Collection[dict[str, object]], request: web.Request) -> dict[str, object]:
    """OpenAI's cursor list: newest first, ``after`` an id, ``limit`` 1..100 (default 20)."""
    try:
        limit = min(100, max(1, int(request.query.get("limit", "20"))))
    except ValueError as exc:
        raise ApiError(
            400, "limit: an integer 1..100", code="invalid_value", param="limit"
        ) from exc
    rows = list(items)
    after = request.query.get("after")
    if after is not None:
        ids = [r["id"] for r in rows]
        rows = rows[ids.index(after) + 1 :] if after in ids else []
    page = rows[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(rows) > limit,
    }
