from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from backends.sglang.capacity import parse_server_info, write_capacity_file
from backends.sglang.endpoints import add_endpoint, parse_endpoints, read_endpoints, remove_endpoint
from backends.sglang.launcher import LaunchConfig, build_command


def test_parse_skips_comments_blanks_and_duplicates() -> None:
    text = "# pool chat\n\n10.0.0.1:30000\n  10.0.0.2:30000  \n# x\n10.0.0.1:30000\n"
    assert parse_endpoints(text) == ["10.0.0.1:30000", "10.0.0.2:30000"]
    for bad in ("nohost", "h:port", "h:0", ":80", "h:70000"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


def test_add_and_remove_keep_comments_and_order(tmp_path: Path) -> None:
    f = tmp_path / "pool.endpoints"
    assert read_endpoints(f) == []
    f.write_text("# my pool\nh1:1\n")
    add_endpoint(f, "h2:2")
    add_endpoint(f, "h2:2")
    assert read_endpoints(f) == ["h1:1", "h2:2"]
    remove_endpoint(f, "h1:1")
    remove_endpoint(f, "absent:9")
    assert f.read_text() == "# my pool\nh2:2\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pool")]  # no temp files left


def test_concurrent_registrations_are_all_kept(tmp_path: Path) -> None:
    f = tmp_path / "pool.endpoints"
    threads = [threading.Thread(target=add_endpoint, args=(f, f"h:{i}")) for i in range(1, 41)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(read_endpoints(f)) == sorted(f"h:{i}" for i in range(1, 41))


def test_parse_server_info_old_and_new_layouts() -> None:
    old = {"max_total_num_tokens": 430000, "max_running_requests": 256, "context_length": 8192}
    new = {
        "chunked_prefill_size": 8192,
        "max_running_requests": None,
        "page_size": 1,
        "internal_states": [{"max_total_num_tokens": 12345, "max_running_requests": 48}],
    }
    a, b = parse_server_info(old), parse_server_info(new)
    assert (a.max_total_tokens, a.max_running_requests, a.context_length) == (430000, 256, 8192)
    assert a.chunked_prefill_size is None
    assert (b.max_total_tokens, b.max_running_requests, b.chunked_prefill_size) == (12345, 48, 8192)


def test_capacity_file_records_and_removes(tmp_path: Path) -> None:
    f = tmp_path / "pool.endpoints.capacity.json"
    hints = parse_server_info({"max_total_num_tokens": 10, "max_running_requests": 2})
    write_capacity_file(f, "h:1", hints)
    write_capacity_file(f, "h:2", hints)
    write_capacity_file(f, "h:1", None)
    assert '"h:2"' in f.read_text() and '"h:1"' not in f.read_text()


def test_build_command_has_the_governed_pool_flags(tmp_path: Path) -> None:
    cfg = LaunchConfig(
        model_path="Qwen/Qwen2.5-0.5B-Instruct",
        port=30001,
        pool_file=tmp_path / "p",
        max_running_requests=64,
        max_queued_requests=128,
        chunked_prefill_size=4096,
        mem_fraction_static=0.8,
        extra_args=("--log-level", "warning"),
    )
    argv = build_command(cfg)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    joined = " ".join(argv)
    for flag in (
        "--model-path Qwen/Qwen2.5-0.5B-Instruct",
        "--port 30001",
        "--enable-metrics",
        "--enable-cache-report",
        "--schedule-policy fcfs",
        "--max-running-requests 64",
        "--max-queued-requests 128",
        "--chunked-prefill-size 4096",
        "--mem-fraction-static 0.8",
    ):
        assert flag in joined
    assert "--max-total-tokens" not in joined and "--tp-size" not in joined
    assert argv[-2:] == ["--log-level", "warning"]
    assert cfg.endpoint == "127.0.0.1:30001"


def test_importing_the_launcher_does_not_import_sglang() -> None:
    code = "import sys, backends.sglang, backends.sglang.__main__; print('sglang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_kv_events_flag_and_addresses_in_the_capacity_output(tmp_path: Path) -> None:
    from prefixindex.wire import KvEventsConfig

    base = {"model_path": "m", "port": 30001, "pool_file": tmp_path / "p"}
    assert "--kv-events-config" not in build_command(LaunchConfig(**base))  # type: ignore[arg-type]
    cfg = LaunchConfig(
        **base,  # type: ignore[arg-type]
        advertise_host="10.0.0.7",
        kv_events_port=5557,
        kv_events_replay_port=5558,
    )
    argv = build_command(cfg)
    flag = KvEventsConfig.from_json(argv[argv.index("--kv-events-config") + 1])
    assert flag.enabled
    assert (flag.endpoint, flag.replay_endpoint) == ("tcp://*:5557", "tcp://*:5558")
    addresses = cfg.kv_events_addresses()
    assert addresses == {
        "endpoint": "tcp://10.0.0.7:5557",
        "replay_endpoint": "tcp://10.0.0.7:5558",
    }
    f = tmp_path / "p.capacity.json"
    hints = parse_server_info({"max_total_num_tokens": 10})
    import dataclasses
    import json

    write_capacity_file(f, cfg.endpoint, dataclasses.replace(hints, kv_events=addresses))
    assert json.loads(f.read_text())[cfg.endpoint]["kv_events"] == addresses


def test_parse_server_info_reads_priority_scheduling_in_both_layouts() -> None:
    from poolstate import Ranking

    top = {  # SGLang returns its server args at the top level (dataclasses.asdict)
        "enable_priority_scheduling": True,
        "priority_scheduling_preemption_threshold": 0,
        "schedule_low_priority_values_first": False,
        "disable_priority_preemption": False,
    }
    assert parse_server_info(top).ranking == Ranking(True, 0, False, True)
    nested = {
        "enable_priority_scheduling": None,
        "internal_states": [
            {"enable_priority_scheduling": False, "priority_scheduling_preemption_threshold": 5}
        ],
    }
    assert parse_server_info(nested).ranking == Ranking(False, 5, None, None)
    assert parse_server_info({"disable_priority_preemption": True}).ranking.preempts is False


def test_a_server_that_does_not_report_priority_scheduling_is_unknown_not_off() -> None:
    old = {"max_total_num_tokens": 10, "enable_priority_scheduling": "yes"}  # not a bool
    hints = parse_server_info(old)
    assert hints.ranking.enabled is None and not hints.ranking.known
    assert "ranking" not in hints.to_json()  # the capacity file stays as it was
    assert parse_server_info(dict(old, enable_priority_scheduling=True)).to_json()["ranking"][
        "enabled"
    ]
