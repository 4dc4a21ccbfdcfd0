"""Line rate (workloads/fabric/linerate.py): sysfs fixtures, the emulated link's payload
ceiling, NCCL's algorithm lines (formats from NCCL's src/enqueue.cc), and the flag for a
busbw above the line rate across nodes."""

from pathlib import Path

import pytest

from workloads.fabric import linerate

FIX = Path(__file__).parent / "fixtures"
SYSFS = FIX / "sysfs"
LOGS = FIX / "nccl_logs"


def test_emulated_100mbit_payload_rate_is_pinned():
    node = linerate.node_line_rate(["net:emu0"], {"rate": "100mbit", "qdisc": "tbf", "mtu": 1500})
    assert node["bits_per_s"] == 1e8
    job = linerate.job_line_rate([node, node], ranks_per_node=1)
    assert job["per_rank(GB/s)"] == pytest.approx(0.0125)
    # tbf counts 1514-byte frames, 1448 of them TCP payload: 12.5 MB/s x 1448/1514
    assert job["payload_per_rank(GB/s)"] == pytest.approx(0.0119551, abs=1e-7)  # README's 0.01195 GB/s
    assert linerate.tcp_payload_fraction(9000) == pytest.approx(8948 / 9014)
    unshaped = linerate.node_line_rate(["net:emu0"], {"rate": None, "mtu": 1500})
    assert unshaped["bits_per_s"] is None and linerate.job_line_rate([unshaped], 1)["per_rank(GB/s)"] is None


def test_sysfs_rates_of_rdma_ports_and_interfaces():
    assert linerate.parse_ib_rate("200 Gb/sec (4X HDR)") == 2e11
    assert linerate.parse_ib_rate("2.5 Gb/sec (1X SDR)") == 2.5e9
    assert linerate.parse_ib_rate("garbage") is None and linerate.parse_ib_rate(None) is None
    roce = linerate.node_line_rate(["rdma:mlx5_0:1", "rdma:mlx5_1:1"], None, SYSFS / "roce_host")
    assert roce["rails"] == {"rdma:mlx5_0:1": 1e11, "rdma:mlx5_1:1": 1e11} and roce["bits_per_s"] == 2e11
    # 8 ranks per node share the node's two 100 Gb/s ports: 25 GB/s / 8 per rank
    job = linerate.job_line_rate([roce, roce], ranks_per_node=8)
    assert job["per_node(GB/s)"] == 25.0 and job["per_rank(GB/s)"] == 3.125
    eth = linerate.node_line_rate(["net:eth0", "net:lo"], None, SYSFS / "nordma_host")
    assert eth["rails"] == {"net:eth0": 1e10, "net:lo": None} and eth["unknown_rails"] == ["net:lo"]
    # The slowest node bounds the job; a node of unknown rate makes the job's rate unknown.
    ib = linerate.node_line_rate(["rdma:mlx5_1:1"], None, SYSFS / "ib_host")  # 10 Gb/sec (4X SDR)
    assert linerate.job_line_rate([roce, ib], 1)["per_node(GB/s)"] == 1.25
    assert linerate.job_line_rate([roce, {"bits_per_s": None}], 1)["per_rank(GB/s)"] is None
    assert linerate.pct(0.0118, 0.0125) == pytest.approx(94.4) and linerate.pct(1.0, None) is None
    assert linerate.describe(job) == ("line rate 3.125 GB/s per rank = 25 GB/s per node (rdma:mlx5_0:1, "
                                      "rdma:mlx5_1:1; sysfs) / 8 rank(s) per node")
    lo = linerate.job_line_rate([linerate.node_line_rate(["net:lo"], None, SYSFS / "nordma_host")], 2)
    assert linerate.describe(lo) == "line rate unknown (no rate for net:lo in sysfs or the emulate block): % of line rate is n/a"


def test_algorithm_lines_both_formats():
    new = linerate.algorithms_in(LOGS / "nccl_tuning_nvls")
    assert new[0] == {"func": "AllReduce", "bytes": 1048576, "algo": "RING", "proto": "LL128"}
    assert {(a["func"], a["bytes"], a["algo"]) for a in new} == {
        ("AllReduce", 1048576, "RING"), ("AllReduce", 268435456, "NVLS"), ("AllGather", 16777216, "RING")}
    old = linerate.algorithms_in(LOGS / "nccl_tuning_old")
    assert old == [{"func": None, "bytes": 1048576, "algo": "RING", "proto": "LL128"},
                   {"func": None, "bytes": 268435456, "algo": "TREE", "proto": "SIMPLE"}]
    assert linerate.algorithms_in(LOGS / "no_such_dir") == []
    # the channel lines of an ordinary log are not tuning lines
    assert linerate.algorithms_in(LOGS / "nccl_roce") == []
    # AllGather logs the per-rank count: a 16-rank row of 256 MiB is 16 MiB per rank
    assert linerate.algorithms_for("all_gather", 268435456, 16, new) == ["RING"]


def _row(op, size, busbw, n=16):
    cell = {"time_us": 1.0, "algbw": busbw, "busbw": busbw, "wrong": 0}
    return {"op": op, "size": size, "group_size": n, "out_of_place": None, "in_place": cell}


def test_busbw_above_line_rate_names_nvls_and_the_ring_remedy():
    algos = linerate.algorithms_in(LOGS / "nccl_tuning_nvls")
    rows = [_row("all_reduce", 1048576, 20.0), _row("all_reduce", 268435456, 60.0)]
    (flag,) = linerate.above_line_rate(rows, per_rank=50.0, nodes=2, algos=algos)
    assert flag["sizes"] == [268435456] and flag["algorithms"] == ["NVLS"]
    assert "NVLink switch" in flag["cause"] and "NCCL_ALGO=Ring" in flag["message"] and "120%" in flag["message"]
    # Tree from the older format, which names no collective
    (old,) = linerate.above_line_rate(rows, 50.0, 2, linerate.algorithms_in(LOGS / "nccl_tuning_old"))
    assert old["algorithms"] == ["TREE"] and "Tree" in old["cause"]
    # no tuning lines: say what to turn on
    (none,) = linerate.above_line_rate(rows, 50.0, 2, [])
    assert "NCCL_DEBUG_SUBSYS" in none["cause"] and none["algorithms"] == []
    # one node (traffic never crosses the NICs), under the rate, or rate unknown: nothing flagged
    assert linerate.above_line_rate(rows, 50.0, 1, algos) == []
    assert linerate.above_line_rate(rows, 100.0, 2, algos) == []
    assert linerate.above_line_rate(rows, None, 2, algos) == []
