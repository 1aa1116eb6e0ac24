"""The twin's own store: expiry and purge (the local fail-open state of a replica)."""

from __future__ import annotations

from ratelimit_service.limiter import Check, MemoryState, reserve, settle

S = 1_000_000


def test_purge_drops_only_what_expired() -> None:
    st = MemoryState()
    now = 1_800_000_000 * S
    bucket = Check("b", "b", 50, 100, 10.0, 0, False, True)
    window = Check("w", "w", 50, 100, 0.0, now + 60 * S, False, True)
    assert reserve(st, "r1", [bucket, window], now, 5_000).admitted
    st.purge(now + S)
    assert set(st.buckets) == {"b"} and set(st.windows) == {"w"} and set(st.records) == {"r1"}
    st.purge(now + 6 * S)  # the record's TTL (5 s) passed; the bucket refills for 5 s + 60 s
    assert "r1" not in st.records and "b" in st.buckets
    assert settle(st, "r1", 0, now + 6 * S).found is False
    st.purge(now + 200 * S)
    assert st.buckets == {} and st.windows == {} and st.records == {}
