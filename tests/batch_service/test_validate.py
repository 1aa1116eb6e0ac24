"""Input files are checked line by line, each problem naming its line (OpenAI's rules)."""

from __future__ import annotations

import json

from batch_service.validate import parse_lines

EP = "/v1/chat/completions"
MODELS = {"llama-3.1-8b", "llama-3.2-1b"}


def line(cid: str, model: str = "llama-3.1-8b", **extra: object) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    obj: dict[str, object] = {"custom_id": cid, "method": "POST", "url": EP, "body": body}
    obj.update(extra)
    return json.dumps(obj).encode()


def test_a_valid_file_gives_its_lines_in_order() -> None:
    data = b"\n".join(line(f"r{i}") for i in range(3)) + b"\n\n"
    lines, errors = parse_lines(data, EP, MODELS, 100)
    assert errors == []
    assert [(x.index, x.custom_id) for x in lines] == [(0, "r0"), (1, "r1"), (2, "r2")]


def test_each_problem_names_its_line() -> None:
    rows = [
        line("a"),
        b"{not json",
        line("b", url="/v1/completions"),
        line("a"),
        line("c", model="gpt-4"),
        line("d", model="llama-3.2-1b"),
        json.dumps({"custom_id": "e", "method": "GET", "url": EP, "body": {}}).encode(),
        line("f", extra_key=1),
        b"",
        line("g"),
    ]
    _, errors = parse_lines(b"\n".join(rows), EP, MODELS, 100)
    got = [(e.line, e.code) for e in errors]
    assert got == [
        (2, "invalid_json_line"),
        (3, "mismatched_endpoint"),
        (4, "duplicate_custom_id"),
        (5, "model_not_found"),
        (6, "mismatched_model"),
        (7, "invalid_request"),
        (8, "invalid_request"),
        (9, "invalid_json_line"),
    ]
    assert "line 4" in errors[2].message and "line 1" in errors[2].message
    assert errors[0].to_json()["line"] == 2


def test_streaming_lines_and_oversized_files_are_refused() -> None:
    body = {"model": "llama-3.1-8b", "stream": True}
    obj = {"custom_id": "s", "method": "POST", "url": EP, "body": body}
    _, errors = parse_lines(json.dumps(obj).encode(), EP, MODELS, 10)
    assert [(e.line, e.param) for e in errors] == [(1, "body.stream")]
    _, errors = parse_lines(b"\n".join(line(f"r{i}") for i in range(4)), EP, MODELS, 3)
    assert [e.code for e in errors] == ["too_many_lines"]
    _, errors = parse_lines(b"\n\n", EP, MODELS, 3)
    assert [e.code for e in errors] == ["empty_file"]


def test_embedding_lines_need_an_input() -> None:
    ep = "/v1/embeddings"

    def emb(cid: str, value: object) -> bytes:
        body = {"model": "llama-3.1-8b", "input": value}
        return json.dumps({"custom_id": cid, "method": "POST", "url": ep, "body": body}).encode()

    good = [emb("a", "text"), emb("b", ["x", "y"]), emb("c", [1, 2]), emb("d", [[1], [2, 3]])]
    lines, errors = parse_lines(b"\n".join(good), ep, MODELS, 100)
    assert errors == [] and len(lines) == 4
    bad = [emb("e", ""), emb("f", []), emb("g", ["x", 1]), emb("h", None), line("i")]
    _, errors = parse_lines(b"\n".join(bad), ep, MODELS, 100)
    assert [(e.line, e.param) for e in errors] == [
        (1, "body.input"), (2, "body.input"), (3, "body.input"), (4, "body.input"), (5, "url"),
    ]  # fmt: skip
