"""OpenAI's object shapes (``file``, ``batch``, output lines) built from stored fields (pure)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping

__all__ = [
    "ACTIVE",
    "TERMINAL",
    "batch_object",
    "error_line",
    "file_object",
    "new_id",
    "output_line",
]

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "expired", "cancelled")
_TIMES = (
    "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
    "cancelling_at", "cancelled_at",
)  # fmt: skip


def new_id(prefix: str) -> str:
    return (
        f"{prefix}_{secrets.token_hex(12)}" if prefix != "file" else f"file-{secrets.token_hex(12)}"
    )


def _int(v: str | None) -> int | None:
    return None if v in (None, "") else int(float(v))


def file_object(meta: Mapping[str, str]) -> dict[str, object]:
    return {
        "id": meta["id"],
        "object": "file",
        "bytes": int(meta["bytes"]),
        "created_at": int(meta["created_at"]),
        "filename": meta.get("filename", ""),
        "purpose": meta.get("purpose", "batch"),
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def batch_object(job: Mapping[str, str]) -> dict[str, object]:
    errors = json.loads(job["errors"]) if job.get("errors") else None
    out: dict[str, object] = {
        "id": job["id"],
        "object": "batch",
        "endpoint": job["endpoint"],
        "errors": None if not errors else {"object": "list", "data": errors},
        "input_file_id": job["input_file_id"],
        "completion_window": job.get("completion_window", "24h"),
        "status": job["status"],
        "output_file_id": job.get("output_file_id") or None,
        "error_file_id": job.get("error_file_id") or None,
        "created_at": int(job["created_at"]),
        "request_counts": {
            "total": int(job.get("total", 0)),
            "completed": int(job.get("completed", 0)),
            "failed": int(job.get("failed", 0)),
        },
        "metadata": json.loads(job["metadata"]) if job.get("metadata") else None,
    }
    for key in _TIMES:
        out[key] = _int(job.get(key))
    return out


def output_line(
    job_id: str, index: int, custom_id: str, status: int, request_id: str, body: object
) -> bytes:
    """One line of the output (2xx) or error (other status) file: the answer as it came."""
    return json.dumps(
        {
            "id": f"batch_req_{job_id}_{index}",
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None,
        },
        separators=(",", ":"),
    ).encode()


def error_line(job_id: str, index: int, custom_id: str, code: str, message: str) -> bytes:
    """A line that got no answer (expired, cancelled): ``response`` null, ``error`` set."""
    return json.dumps(
        {
            "id": f"batch_req_{job_id}_{index}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        },
        separators=(",", ":"),
    ).encode()
