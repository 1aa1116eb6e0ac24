"""The overload benchmark's per-request rows: attempts grouped by request, in order, with the
TTFT counted from the first send (retries included)."""

from __future__ import annotations

import json

from overload_client import Attempt
from overload_rows import rows


def test_a_retried_request_is_one_row_timed_from_its_first_send() -> None:
    shed = Attempt(request=7, lane="interactive", number=1, sent=1.0, status=503,
                   answered=1.25, error="tokenweir_shed_fell_behind", retry_after=2.0)  # fmt: skip
    ok = Attempt(request=7, lane="interactive", number=2, sent=3.5, status=200,
                 answered=3.51, first_token=4.0, ok=True, told_to_wait=2.0)  # fmt: skip
    other = Attempt(request=2, lane="batch", number=1, sent=0.5, status=503, answered=0.51)
    out = rows("tokenweir", "3x", [ok, other, shed])
    assert [r["request"] for r in out] == [2, 7]
    row = out[1]
    assert row["lane"] == "interactive" and row["ttft_ms"] == 3000.0
    assert [a["status"] for a in row["attempts"]] == [503, 200]
    first, second = row["attempts"]
    assert first["answered_ms"] == 250.0 and first["retry_after"] == 2.0
    assert first["error"] == "tokenweir_shed_fell_behind"
    assert second["waited"] == 2.0 and second["first_token_ms"] == 500.0
    assert out[0]["ttft_ms"] is None  # never succeeded
    json.dumps(out)  # a JSON line each
