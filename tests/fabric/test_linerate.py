"""Line rate (workloads/fabric/linerate.py): sysfs fixtures, the emulated link's payload
ceiling, NCCL's algorithm lines (formats from NCCL's src/enqueue.cc), and the flag for a
busbw above the line rate across nodes."""



import pytest

from helpers import FIXTURES
from helpers.profiles import NCCL_LOGS
from workloads.fabric import linerate

FIX = FIXTURES
SYSFS = FIX / "sysfs"
LOGS = FIX / "nccl_logs"


def test_emulated_100mbit_payload_rate_is_pinned():
    node = linerate.node_line_rate(["net:emu0"], {"rate": "100mbit", "qdisc": "tbf", "mtu": 1500})
    assert node["bits_per_s"] == 1e8
    job = linerate.job_line_rate([node, node], ranks_per_node=1)
    assert job["per_comm(GB/s)"] == pytest.approx(0.0125)
    # tbf counts 1514-byte frames, 1448 of them TCP payload: 12.5 MB/s x 1448/1514
    assert job["payload_per_comm(GB/s)"] == pytest.approx(0.0119551, abs=1e-7)  # docs/verification.md's 0.01195 GB/s
    assert linerate.tcp_payload_fraction(9000) == pytest.approx(8948 / 9014)
    unshaped = linerate.node_line_rate(["net:emu0"], {"rate": None, "mtu": 1500})
    assert unshaped["bits_per_s"] is None and linerate.job_line_rate([unshaped], 1)["per_comm(GB/s)"] is None


def test_sysfs_rates_of_rdma_ports_and_interfaces():
    assert linerate.parse_ib_rate("200 Gb/sec (4X HDR)") == 2e11
    assert linerate.parse_ib_rate("2.5 Gb/sec (1X SDR)") == 2.5e9
    assert linerate.parse_ib_rate("garbage") is None and linerate.parse_ib_rate(None) is None
    roce = linerate.node_line_rate(["rdma:mlx5_0:1", "rdma:mlx5_1:1"], None, SYSFS / "roce_host")
    assert roce["rails"] == {"rdma:mlx5_0:1": 1e11, "rdma:mlx5_1:1": 1e11} and roce["bits_per_s"] == 2e11
    # 8 communicators per node (one_per_node: one per local rank) share its two 100 Gb/s ports
    job = linerate.job_line_rate([roce, roce], ranks_per_node=8, comms_per_node=8)
    assert job["per_node(GB/s)"] == 25.0 and job["per_comm(GB/s)"] == 3.125
    eth = linerate.node_line_rate(["net:eth0", "net:lo"], None, SYSFS / "nordma_host")
    assert eth["rails"] == {"net:eth0": 1e10, "net:lo": None} and eth["unknown_rails"] == ["net:lo"]
    # The slowest node bounds the job; a node of unknown rate makes the job's rate unknown.
    ib = linerate.node_line_rate(["rdma:mlx5_1:1"], None, SYSFS / "ib_host")  # 10 Gb/sec (4X SDR)
    assert linerate.job_line_rate([roce, ib], 1)["per_node(GB/s)"] == 1.25
    assert linerate.job_line_rate([roce, {"bits_per_s": None}], 1)["per_comm(GB/s)"] is None
    assert linerate.pct(0.0118, 0.0125) == pytest.approx(94.4) and linerate.pct(1.0, None) is None
    assert linerate.describe(job) == ("line rate 3.125 GB/s per communicator = 25 GB/s per node (rdma:mlx5_0:1, "
                                      "rdma:mlx5_1:1; sysfs) / 8 communicator(s) per node crossing its rails")
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
    (flag,) = linerate.above_line_rate(rows, per_comm=50.0, nodes=2, algos=algos)
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


def test_a_communicator_spanning_whole_nodes_is_bounded_by_the_node_aggregate():
    """2 x 8 H100 with 8 x 400G per node: NCCL's ring hops once per node per channel, so the
    node's rails carry what one rank sends and a healthy 370 GB/s all_reduce is within the
    node's 400 GB/s (NCCL src/graph/tuning.cc v2.30.7: busBw = nChannels x bwInter; "DGX-1
    can get 48 GB/s because we have 4 IB adapters", NVIDIA/nccl-tests#29). Only patterns with
    one communicator per local rank across nodes share the rails."""
    from workloads.collectives.settings import pattern_groups
    from workloads.fabric.ceiling import all_reduce_ceiling

    node = {"source": "sysfs", "rails": {f"rdma:mlx5_{i}:1": 4e11 for i in range(8)}, "bits_per_s": 8 * 4e11}
    share = {p: linerate.communicators_per_node(pattern_groups(p, 16, 8), 8) for p in ("all", "one_per_node", "pairs")}
    assert share == {"all": 1, "one_per_node": 8, "pairs": 8}
    # pairs on four nodes: rank r with r + 16, every pair across nodes, 8 per node
    assert linerate.communicators_per_node(pattern_groups("pairs", 32, 8), 8) == 8
    whole = linerate.job_line_rate([node, node], 8, share["all"])
    assert whole["per_comm(GB/s)"] == 400.0 and whole["comms_per_node"] == 1
    rows = [_row("all_reduce", 268435456, 370.0)]
    ring = [{"func": "AllReduce", "bytes": 268435456, "algo": "RING", "proto": "SIMPLE"}]
    assert linerate.above_line_rate(rows, whole["per_comm(GB/s)"], 2, ring) == []
    assert linerate.pct(370.0, whole["per_comm(GB/s)"]) == pytest.approx(92.5)
    rec = {"world": {"world_size": 16, "nodes": 2}, "line_rate": whole}
    c = all_reduce_ceiling(rec)
    assert c.judge(370.0) and (c.low_gbps, c.high_gbps) == (160.0, 480.0) and "NIC aggregate" in c.source
    # one_per_node: eight 2-rank communicators cross the same rails at once, 50 GB/s each
    split = linerate.job_line_rate([node, node], 8, share["one_per_node"])
    assert split["per_comm(GB/s)"] == 50.0
    (flag,) = linerate.above_line_rate(rows, split["per_comm(GB/s)"], 2, ring)
    assert "740%" in flag["message"] and "check the rails counted" in flag["cause"]


def test_line_rate_counts_only_the_ports_the_channels_used():
    from helpers.profiles import evidence, profile
    from workloads.fabric import linerate, nccl_log, nic, verify

    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "nccl_2.30_idle_ports"))
    assert [d["name"] for d in s["devices_listed"]] == ["mlx5_0", "mlx5_1", "mlx5_4"]
    assert [d["name"] for d in s["devices"]] == ["mlx5_0"]
    transport = verify.decide(profile("ib"), evidence("nccl_2.30_idle_ports"), environ={})
    assert transport["verdict"] == "ok"
    rails = nic.rails_for(profile("ib"), {}, transport)
    assert rails == ["rdma:mlx5_0:1"]
    # the per-rank bound busbw is compared with: one 200 Gb/s port, not three ports' worth
    rate = linerate.node_line_rate(rails, root=FIXTURES / "sysfs" / "ib_host")
    assert rate["bits_per_s"] == 200e9 and rate["unknown_rails"] == []
    assert linerate.job_line_rate([rate, rate], 1)["per_comm(GB/s)"] == 25.0


def test_a_channel_on_a_merged_virtual_nic_keeps_every_listed_port():
    """A virtual NIC (NCCL_IB_MERGE_NICS) is numbered after the listed ports: its index names
    no listed device, so nothing is dropped on a guess."""
    from workloads.fabric import nccl_log

    lg = nccl_log.parse_text("h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB; OOB ib0:10.0.0.1<0>\n"
                             "h:1:2 [0] NCCL INFO Using network IB\n"
                             "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/2/GDRDMA\n")
    assert lg.net_devs_used == [2] and [d["name"] for d in lg.used_devices] == ["mlx5_0", "mlx5_1"]


def test_ceiling_across_nodes_is_the_line_rate_of_the_rails_used():
    from workloads.fabric.ceiling import all_reduce_ceiling

    rec = {"world": {"world_size": 4, "nodes": 2}, "line_rate": {"per_comm(GB/s)": 0.0125},
           "fabric": {"transport": {"summary": {"backend": "gloo"}}}}
    c = all_reduce_ceiling(rec)
    assert c.line_gbps == 0.0125 and "rails the channels used" in c.source


def test_nccl_2_23_calls_are_parsed_and_2_19_says_it_logs_none():
    """2.23 names the function and numbers the algorithm and protocol (v2.23.4-1 src/enqueue.cc:1855,
    "%s: %ld Bytes -> Algo %d proto %d time %f"; NCCL_ALGO_* and NCCL_PROTO_* of its
    src/include/nccl_common.h: 4 NVLS, 0 TREE, 1 RING; 1 LL128, 2 SIMPLE). 2.19 comments the
    INFO line out (v2.19.4-1 enqueue.cc:1217), so its log has none and the cause says so."""
    calls = linerate.algorithms_in(LOGS / "nccl_2.23_tuning_calls")
    assert calls == [{"func": "AllReduce", "bytes": 1048576, "algo": "TREE", "proto": "LL128"},
                     {"func": "AllReduce", "bytes": 268435456, "algo": "NVLS", "proto": "SIMPLE"},
                     {"func": "AllGather", "bytes": 16777216, "algo": "RING", "proto": "SIMPLE"}]
    rows = [_row("all_reduce", 268435456, 60.0)]
    (flag,) = linerate.above_line_rate(rows, 50.0, 2, calls, linerate.version_in(LOGS / "nccl_2.23_tuning_calls"))
    assert flag["algorithms"] == ["NVLS"] and "NVLink switch" in flag["cause"]
    old = LOGS / "nccl_2.19_no_calls"
    assert linerate.algorithms_in(old) == [] and linerate.version_in(old) == (2, 19, 3)
    (none,) = linerate.above_line_rate(rows, 50.0, 2, [], linerate.version_in(old))
    assert none["cause"].startswith("NCCL 2.19.3 logs no per-call algorithm"), none["cause"]
