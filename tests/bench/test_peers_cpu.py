"""CPU per process of a process tree (bench/peers_cpu.py), on a fake /proc."""

from __future__ import annotations

from pathlib import Path

from peers_cpu import label_of, per_request_ms, snapshot


def _proc(
    root: Path, pid: int, cmd: list[str], ticks: tuple[int, int], children: list[int]
) -> None:
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmd) + b"\0")
    fields = ["S", "1", "1", "1"] + ["0"] * 7 + [str(ticks[0]), str(ticks[1])] + ["0"] * 10
    (d / "stat").write_text(f"{pid} (x y) " + " ".join(fields))
    (d / "task" / str(pid) / "children").write_text(" ".join(map(str, children)))


def test_a_tree_is_summed_per_role(tmp_path: Path) -> None:
    _proc(tmp_path, 10, ["/v/bin/python3", "/v/bin/tokenweir", "up"], (100, 0), [11, 12, 13])
    _proc(tmp_path, 11, ["/v/bin/python3", "-m", "filters", "--policy", "p"], (250, 50), [])
    _proc(tmp_path, 12, ["/v/bin/python3", "-m", "filters", "--policy", "p"], (100, 0), [])
    _proc(tmp_path, 13, ["/v/lib/envoy/envoy", "-c", "x.json"], (40, 10), [])
    _proc(tmp_path, 20, ["redis-server 127.0.0.1:7000"], (5, 5), [])
    snap = snapshot([10, 20, 99], proc=tmp_path, ticks=100)  # 99 does not exist
    assert snap["filters"].seconds == 4.0 and snap["filters"].processes == 2
    assert snap["filters"].python and not snap["envoy"].python
    assert snap["controlplane"].seconds == 1.0
    assert snap["redis"].seconds == 0.1
    before = {**snap}
    _proc(tmp_path / "later", 0, ["x"], (0, 0), [])  # unrelated
    after = snapshot([10, 20], proc=tmp_path, ticks=100)
    assert per_request_ms(before, after, 10)["filters"] == {
        "ms": 0.0,
        "python": True,
        "runqueue_ms": 0.0,
    }


def test_the_wait_for_a_cpu_comes_from_schedstat(tmp_path: Path) -> None:
    _proc(tmp_path, 11, ["/v/bin/python3", "-m", "filters"], (10, 0), [12])
    _proc(tmp_path, 12, ["/v/bin/python3", "-c", "from multiprocessing.spawn import x"], (5, 0), [])
    (tmp_path / "11" / "task" / "11" / "schedstat").write_text("100000000 2000000000 40\n")
    (tmp_path / "11" / "task" / "13").mkdir()  # a second thread of the filter server
    (tmp_path / "11" / "task" / "13" / "schedstat").write_text("1 500000000 2\n")
    (tmp_path / "12" / "task" / "12" / "schedstat").write_text("50000000 500000000 7\n")
    before = snapshot([11], proc=tmp_path, ticks=100)
    assert before["filters"].waited == 2.5 and before["spawned-worker"].waited == 0.5
    (tmp_path / "11" / "task" / "11" / "schedstat").write_text("200000000 4000000000 80\n")
    after = snapshot([11], proc=tmp_path, ticks=100)
    assert per_request_ms(before, after, 4)["filters"]["runqueue_ms"] == 500.0


def test_per_request_ms_divides_the_difference() -> None:
    from peers_cpu import ProcCpu

    before = {"envoy": ProcCpu(1.0, False, 1)}
    after = {"envoy": ProcCpu(1.5, False, 1), "litellm": ProcCpu(2.0, True, 2)}
    out = per_request_ms(before, after, 100)
    assert out == {
        "envoy": {"ms": 5.0, "python": False, "runqueue_ms": 0.0},
        "litellm": {"ms": 20.0, "python": True, "runqueue_ms": 0.0},
    }
    assert per_request_ms(before, after, 0) == {}


def test_labels() -> None:
    assert (
        label_of(["/v/bin/python", "-m", "sglang_router.launch_router", "--port", "1"])
        == "sglang-router"
    )
    assert (
        label_of(["/p/.venv-peers/bin/python3", "/p/.venv-peers/bin/litellm", "--config", "c"])
        == "litellm"
    )
    assert label_of(["python", "-m", "backends.emulator"]) == "emulator"
    # the picker's mapper process: apart from the filter server that starts it
    assert label_of(["/v/bin/python", "-m", "filters.plugins.picker.worker"]) == "spawned-worker"
    assert label_of(["/v/bin/python", "-m", "filters", "--policy", "p.yaml"]) == "filters"
    assert (
        label_of(["python", "-m", "ratelimit_service", "--policy", "filters.yaml"])
        == "ratelimit_service"
    )
    assert label_of(["sglang::router"]) == "sglang-router"
    assert label_of(["/usr/bin/k6", "run"]) == "k6"
    assert label_of([]) == "?"
