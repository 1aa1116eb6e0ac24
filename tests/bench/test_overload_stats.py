"""The overload benchmark's summaries, time series, targets and report, on hand-made attempts."""

from __future__ import annotations

from pathlib import Path

import yaml
from overload_arms import EmulatorPool, PoolSpec, plain_envoy_bootstrap
from overload_client import Attempt
from overload_report import PLOTS, markdown, write_outputs
from overload_stats import percentile, summarize, targets, timeline
from overload_tokenweir import Variant, bench_policy, make_arm, merge

from policy import load_policy


def ok(req: int, lane: str, sent: float, first: float, n: int = 3, number: int = 1) -> Attempt:
    times = [first + 0.1 * i for i in range(n)]
    return Attempt(
        req, lane, number, sent, status=200, answered=sent + 0.001, first_token=first,
        tokens=n, token_times=times, ok=True,
    )  # fmt: skip


def shed(
    req: int, lane: str, sent: float, ra: float | None, number: int = 1, told: float | None = None
) -> Attempt:
    return Attempt(
        req, lane, number, sent, status=503, answered=sent + 0.004, retry_after=ra,
        told_to_wait=told, error="queue_full",
    )  # fmt: skip


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0
    assert percentile([5.0], 0.99) == 5.0


def test_summary_counts_per_lane_and_follows_retries() -> None:
    attempts = [
        ok(0, "interactive", 1.0, 1.2),
        # batch request 1: shed with Retry-After, waited as told, got in
        shed(1, "batch", 1.0, 2.0),
        ok(1, "batch", 3.1, 3.5, number=2),
        # batch request 2: shed twice, the second time after waiting as told, then gave up
        shed(2, "batch", 1.0, 1.0),
        shed(2, "batch", 2.2, None, number=2, told=1.0),
        # batch request 3: abandoned
        Attempt(3, "batch", 1, 1.0, error="abandoned"),
        # interactive request 4: no HTTP answer at all
        Attempt(4, "interactive", 1, 1.0, error="connection: ServerDisconnectedError"),
    ]
    attempts[2].told_to_wait = 2.0
    s = summarize(attempts, window=(0.0, 10.0))
    i, b, a = s["interactive"], s["batch"], s["all"]
    assert i["requests"] == 2 and i["success_rate"] == 0.5 and i["rejections"] == 0
    assert i["connection_errors"] == {"connection: ServerDisconnectedError": 1}
    assert b["connection_errors"] == {}
    assert i["ttft_ms"]["p50"] == 200.0
    assert b["requests"] == 3 and b["attempts"] == 5
    assert b["success_rate"] == round(1 / 3, 4) and b["first_try_success"] == 0.0
    assert b["ttft_ms"]["p50"] == 2500.0  # from the first send, retries included
    assert b["tbt_ms"]["p50"] == 100.0
    assert b["rejections"] == 3 and b["rejection_statuses"] == {"503": 3}
    assert b["rejection_ms_p99"] == 4.0
    assert b["rejection_ms_p99_by_reason"] == {"queue_full": 4.0}
    assert b["immediate_rejection_ms_p99"] == 4.0
    assert b["rejections_with_retry_after"] == round(2 / 3, 4)
    assert b["retries_after_retry_after"] == 2 and b["retry_after_accuracy"] == 0.5
    assert b["abandoned"] == 1 and b["attempts_per_success"] == 5.0
    assert a["requests"] == 5 and a["goodput_tok_s"] == 0.6  # 6 tokens in 10 s
    narrow = summarize(attempts, window=(3.0, 4.0))["all"]
    assert narrow["goodput_tok_s"] == 3.0  # only request 1's tokens fall in [3, 4)


def test_a_shed_after_a_wait_in_the_queue_is_not_an_immediate_one() -> None:
    late = shed(1, "batch", 1.0, 2.0)
    late.error, late.answered = "fell_behind", 1.9
    s = summarize([shed(0, "batch", 1.0, 2.0), late], window=(0.0, 10.0))["batch"]
    assert s["rejection_ms_p99"] == 900.0
    assert s["immediate_rejection_ms_p99"] == 4.0


def test_timeline_rates_per_bucket() -> None:
    attempts = [
        ok(0, "interactive", 0.1, 0.3),
        shed(1, "batch", 0.2, 1.0),
        shed(1, "batch", 1.2, 1.0, 2),
    ]
    tl = timeline(attempts, bucket=0.5, end=2.0)
    assert tl["t"] == [0.25, 0.75, 1.25, 1.75]
    assert tl["offered_all"] == [4.0, 0.0, 2.0, 0.0]  # 2 attempts in the first 0.5 s = 4/s
    assert tl["offered_batch"] == [2.0, 0.0, 2.0, 0.0]
    assert tl["started_interactive"] == [2.0, 0.0, 0.0, 0.0]
    assert tl["rejected_all"] == [2.0, 0.0, 2.0, 0.0]


def _level(
    ttft95: float,
    success: float,
    goodput: float,
    rej99: float | None,
    ra: float | None,
    acc: float | None,
    at_once99: float | None = None,
) -> dict:  # type: ignore[type-arg]
    lane = {
        "ttft_ms": {"p50": None, "p95": ttft95, "p99": None}, "success_rate": success,
        "goodput_tok_s": goodput, "rejection_ms_p99": rej99, "rejections_with_retry_after": ra,
        "retry_after_accuracy": acc,
        "immediate_rejection_ms_p99": rej99 if at_once99 is None else at_once99,
    }  # fmt: skip
    return {"interactive": lane, "batch": lane, "all": lane}


def test_targets_at_3x() -> None:
    levels = {
        "0.25x": _level(100.0, 1.0, 50.0, None, None, None),
        "1x": _level(150.0, 1.0, 200.0, None, None, None),
        "3x": _level(190.0, 0.995, 194.0, 6.0, 1.0, 0.93),
    }
    rows = {r["name"]: r for r in targets(levels)}
    assert all(r["met"] for r in rows.values()), rows
    assert rows["interactive p95 TTFT vs unloaded"]["measured"] == 1.9
    assert rows["pool goodput vs 1x"]["measured"] == 0.97
    levels["3x"] = _level(250.0, 0.9, 150.0, 12.0, 0.5, 0.5)
    assert not any(r["met"] for r in targets(levels))
    # sheds answered at arrival are fast; the ones shed after a wait in the queue are not
    levels["3x"] = _level(190.0, 0.995, 194.0, 900.0, 1.0, 0.93, at_once99=4.0)
    rows = {r["name"]: r for r in targets(levels)}
    assert rows["rejection latency p99, answered at arrival"]["met"] is True
    assert rows["rejection latency p99, queued then shed included"]["met"] is False
    levels["3x"] = _level(150.0, 1.0, 200.0, None, None, None)  # nothing was rejected
    rows = {r["name"]: r for r in targets(levels)}
    assert rows["rejection latency p99, answered at arrival"]["met"] is None
    assert targets({"0.25x": levels["0.25x"]}) == []
    # a run of 3x alone (or 1x and 3x) has no unloaded reference: not measured, not "1x, met"
    for alone in ({"3x": levels["3x"]}, {"1x": levels["1x"], "3x": levels["3x"]}):
        rows = {r["name"]: r for r in targets(alone)}
        assert rows["interactive p95 TTFT vs unloaded"] == {
            "name": "interactive p95 TTFT vs unloaded", "target": "<= 2x",
            "measured": None, "met": None,
        }  # fmt: skip


def test_report_writes_json_markdown_and_the_plots(tmp_path: Path) -> None:
    attempts = [ok(0, "interactive", 0.1, 0.3), shed(1, "batch", 0.2, 1.0)]
    level = summarize(attempts, window=(0.0, 2.0))
    sample = {"t": 0.0, "waiting_interactive": 1.0, "waiting_batch": 2.0, "backend_queued": 0.0}
    result = {
        "levels": {"tokenweir": {"0.25x": level, "1x": level, "3x": level}},
        "samples": {"tokenweir": {"0.25x": [sample], "1x": [sample], "3x": [sample]}},
        "storm": {
            "tokenweir": {
                "honour": {"summary": level["all"], "base_rps": 1.0, "spike": [1, 2], "arrivals": 2}
            }
        },
        "timelines": {"tokenweir": {"honour": timeline(attempts, bucket=0.5, end=10.0)}},
    }
    result["targets"] = {"tokenweir": targets(result["levels"]["tokenweir"])}
    write_outputs(result, tmp_path / "out", tmp_path / "img")
    md = (tmp_path / "out" / "overload.md").read_text()
    assert "| tokenweir | 3x | batch |" in md and "Targets at 3x" in md and "Retry storm" in md
    assert (tmp_path / "out" / "overload.json").stat().st_size > 100
    for name in PLOTS:
        assert (tmp_path / "img" / name).read_bytes()[:4] == b"\x89PNG"
    assert markdown(result) == md


def test_the_bench_policy_loads_as_shipped_and_as_run(tmp_path: Path) -> None:
    shipped = load_policy(Path(__file__).resolve().parents[2] / "bench" / "overload_policy.yaml")
    assert shipped.pools["chat"].capacity.max_running_requests == 16
    spec = PoolSpec(2, 8, "llama-3.1-8b-h100", 5.0, 10.0, 10.0)
    pool = EmulatorPool(spec, tmp_path, ports=[41001, 41002])
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(bench_policy(pool, 41000, spec)))
    policy = load_policy(path)
    chat = policy.pools["chat"]
    assert [str(e) for e in chat.endpoints] == ["127.0.0.1:41001", "127.0.0.1:41002"]
    assert chat.capacity.max_running_requests == 8
    assert str(policy.gateways["edge"].listen) == "127.0.0.1:41000"
    tiers = {t.tier for t in policy.tenants.values()}
    assert {policy.tiers[t].lane for t in tiers} == {"interactive", "batch"}


def test_the_variant_arm_merges_its_policy_and_adds_its_emulator_flags(tmp_path: Path) -> None:
    spec = PoolSpec(2, 8, "llama-3.1-8b-h100", 5.0, 10.0, 10.0)
    pool = EmulatorPool(spec, tmp_path, ports=[41001, 41002])
    variant = Variant(
        {"admission": {"batch": {"max_share": 0.4}}}, ("--chunked-prefill-size", "1024")
    )
    arm = make_arm("tokenweir-variant", pool, tmp_path, variant=variant)
    assert pool.extra_args == ("--enable-priority-scheduling", "--chunked-prefill-size", "1024")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(merge(bench_policy(pool, 41000, spec), arm.overrides)))
    policy = load_policy(path)
    assert policy.admission.batch.max_share == 0.4
    assert policy.admission.batch.max_wait == 10.0  # the rest of the lane kept
    plain = make_arm("tokenweir", EmulatorPool(spec, tmp_path), tmp_path)
    assert plain.pool.extra_args == ("--enable-priority-scheduling",)


def test_the_plain_envoy_arm_is_round_robin_with_no_governance() -> None:
    b = plain_envoy_bootstrap(10000, [1, 2, 3])
    (cluster,) = b["static_resources"]["clusters"]
    assert cluster["lb_policy"] == "ROUND_ROBIN"
    assert len(cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 3
    hcm = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert [f["name"] for f in hcm["http_filters"]] == ["envoy.filters.http.router"]
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["timeout"] == "0s"  # streams are never cut by a route timeout


def test_the_interactive_alone_arm_gets_only_interactive_arrivals_by_least_request(
    tmp_path: Path,
) -> None:
    spec = PoolSpec(2, 4, "llama-3.1-8b-h100", 1.0, 5.0, 10.0)
    arm = make_arm("interactive-alone", EmulatorPool(spec, tmp_path), tmp_path)
    assert arm.lanes == ("interactive",)
    assert make_arm("envoy", EmulatorPool(spec, tmp_path), tmp_path).lanes is None
    b = plain_envoy_bootstrap(10000, [1, 2], "LEAST_REQUEST")
    (cluster,) = b["static_resources"]["clusters"]
    assert cluster["lb_policy"] == "LEAST_REQUEST"


def test_replica_lane_summary_finds_interactive_waiting_beside_preemptable_batch() -> None:
    from overload_stats import replica_lane_summary

    def view(
        running: dict[str, int],
        waiting: dict[str, int],
        prefilling: dict[str, int] | None = None,
        pre: int = 0,
    ) -> dict:
        return {
            "running": running,
            "waiting": waiting,
            "prefilling": prefilling or {},
            "preempted_total": pre,
        }

    samples = [
        [view({}, {}), view({}, {})],  # idle: not counted
        [view({"100": 4}, {"100": 2}, pre=1), view({"0": 3}, {})],  # misplaced
        [view({"100": 2}, {"100": 1}), view({"0": 3}, {}, prefilling={"0": 3})],  # batch prefilling
        [view({"100": 2, "0": 1}, {}, pre=3), view({"100": 2}, {}, pre=2)],
    ]
    out = replica_lane_summary(samples, 100)
    assert out["samples"] == 3
    assert out["interactive_waiting_beside_preemptable_batch"] == round(1 / 3, 4)
    assert out["interactive_waiting_in_replicas_mean"] == 1.0
    assert out["interactive_running_gap_mean"] == round((4 + 2 + 0) / 3, 2)
    assert out["preempted"] == 5


def test_the_queue_scrape_reads_only_the_series_it_wants() -> None:
    from overload_scrape import _GATEWAY, _samples

    page = "\n".join(
        [
            "# HELP tokenweir_admission_queued requests waiting",
            "# TYPE tokenweir_admission_queued gauge",
            'tokenweir_admission_queued{pool="chat",lane="interactive"} 3.0',
            'tokenweir_admission_queued{pool="chat",lane="batch"} 7.0',
            'tokenweir_admission_queued_extra{pool="chat"} 99.0',
            'tokenweir_admission_in_flight{pool="chat"} 12.0',
            "tokenweir_admission_reserved bad",
        ]
    )
    got = _samples(page, _GATEWAY)
    assert [(n, v) for n, _, v in got] == [
        ("tokenweir_admission_queued", 3.0),
        ("tokenweir_admission_queued", 7.0),
        ("tokenweir_admission_in_flight", 12.0),
    ]
    assert 'lane="batch"' in got[1][1]
