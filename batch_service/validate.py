"""An input file checked line by line, as OpenAI checks it (pure; no I/O).

Each line must be a JSON object ``{"custom_id": str, "method": "POST", "url": <the batch's
endpoint>, "body": {...}}``; ``custom_id`` is unique in the file; every line names the same
``body.model``, one the mesh's pools serve; no line streams. Problems carry their 1-based line.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["EMBEDDINGS", "ENDPOINTS", "Line", "LineError", "parse_lines"]

# what a batch may call: the OpenAI endpoints the pools (SGLang, the emulator) serve;
# embeddings only where the policy routes them to a pool (batch_service/endpoints.py)
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
EMBEDDINGS = "/v1/embeddings"
MAX_ERRORS = 100  # problems reported for one file (OpenAI stops early too)


@dataclass(frozen=True, slots=True)
class Line:
    index: int  # 0-based position in the file
    custom_id: str
    body: dict[str, object]


@dataclass(frozen=True, slots=True)
class LineError:
    line: int  # 1-based
    code: str
    message: str
    param: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


def _check(n: int, raw: bytes, endpoint: str, models: Collection[str]) -> Line | LineError:
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return LineError(n, "invalid_json_line", f"line {n}: not valid JSON ({exc})")
    if not isinstance(obj, dict):
        return LineError(n, "invalid_json_line", f"line {n}: expected a JSON object")
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        return LineError(
            n, "invalid_request", f"line {n}: unknown key(s) {unknown}; allowed: custom_id, "
            "method, url, body", unknown[0],
        )  # fmt: skip
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return LineError(
            n, "missing_required_parameter", f"line {n}: custom_id: a non-empty string is required",
            "custom_id",
        )  # fmt: skip
    if obj.get("method") != "POST":
        return LineError(n, "invalid_request", f"line {n}: method: only POST is allowed", "method")
    if obj.get("url") != endpoint:
        return LineError(
            n, "mismatched_endpoint",
            f"line {n}: url: {obj.get('url')!r} is not the batch's endpoint {endpoint!r}", "url",
        )  # fmt: skip
    body = obj.get("body")
    if not isinstance(body, dict):
        return LineError(
            n, "missing_required_parameter", f"line {n}: body: a JSON object is required", "body"
        )
    model = body.get("model")
    if not isinstance(model, str) or model not in models:
        return LineError(
            n, "model_not_found",
            f"line {n}: body.model: {model!r} is not served here; served: {sorted(models)}",
            "body.model",
        )  # fmt: skip
    if endpoint == EMBEDDINGS and not _embedding_input(body.get("input")):
        return LineError(
            n, "invalid_request", f"line {n}: body.input: a non-empty string, list of strings, "
            "list of token ids or list of token-id lists is required", "body.input",
        )  # fmt: skip
    if body.get("stream"):
        return LineError(
            n, "invalid_request", f"line {n}: body.stream: a batch line cannot stream",
            "body.stream",
        )  # fmt: skip
    return Line(n - 1, cid, body)


def _embedding_input(value: object) -> bool:
    """OpenAI's four forms of an embeddings ``input`` (the gateway checks the rest)."""
    if isinstance(value, str):
        return bool(value)
    if not isinstance(value, list) or not value:
        return False
    return _ids(value) or all(isinstance(v, str) and v for v in value) or all(map(_ids, value))


def _ids(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    )


def parse_lines(
    data: bytes, endpoint: str, models: Collection[str], max_lines: int
) -> tuple[list[Line], list[LineError]]:
    """The file's lines, or every problem found (at most :data:`MAX_ERRORS`). Blank lines at
    the end are allowed; a blank line inside the file is a problem."""
    raw_lines = data.split(b"\n")
    while raw_lines and not raw_lines[-1].strip():
        raw_lines.pop()
    lines: list[Line] = []
    errors: list[LineError] = []
    if not raw_lines:
        errors.append(LineError(1, "empty_file", "the input file has no lines"))
    if len(raw_lines) > max_lines:
        errors.append(
            LineError(
                max_lines + 1, "too_many_lines",
                f"the file has {len(raw_lines)} lines; at most {max_lines} are allowed",
            )
        )  # fmt: skip
        return [], errors
    seen: dict[str, int] = {}
    model: str | None = None
    for n, raw in enumerate(raw_lines, start=1):
        if len(errors) >= MAX_ERRORS:
            break
        got = _check(n, raw, endpoint, models)
        if isinstance(got, LineError):
            errors.append(got)
            continue
        if got.custom_id in seen:
            errors.append(
                LineError(
                    n, "duplicate_custom_id",
                    f"line {n}: custom_id {got.custom_id!r} already used on line "
                    f"{seen[got.custom_id]}", "custom_id",
                )
            )  # fmt: skip
            continue
        seen[got.custom_id] = n
        this = str(got.body["model"])
        if model is None:
            model = this
        elif this != model:
            errors.append(
                LineError(
                    n, "mismatched_model",
                    f"line {n}: body.model: {this!r}; every line of a batch must use one model "
                    f"({model!r} from the first line)", "body.model",
                )
            )  # fmt: skip
            continue
        lines.append(got)
    return lines, errors
