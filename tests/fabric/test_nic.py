"""Every node's NIC counters (workloads/fabric/nic.py): congestion and pause counters from
fixtures (hw_counters names from the brief's mlx5 list; `ethtool -S` names from the mlx5
driver's en_stats.c), % of line rate per rail, and Jain's index over all nodes' rails."""

import shutil
import time

import pytest

from helpers import FIXTURES
from workloads.fabric import nic

SYSFS = FIXTURES / "sysfs"

# `ethtool -S` of an mlx5 port (counter names as drivers/net/ethernet/mellanox/mlx5/core/en_stats.c prints them)
ETHTOOL = """NIC statistics:
     rx_packets: 1201
     tx_bytes: 99887766
     rx_pause_ctrl_phy: 17
     tx_pause_ctrl_phy: 4
     rx_prio3_pause: 17
     rx_prio3_pause_duration: 2340
     tx_prio3_pause: 4
     rx_prio3_pause_transition: 9
"""


def test_pause_counters_are_every_pause_named_counter():
    got = nic.parse_ethtool_pause(ETHTOOL)
    assert got == {"rx_pause_ctrl_phy": 17, "tx_pause_ctrl_phy": 4, "rx_prio3_pause": 17,
                   "rx_prio3_pause_duration": 2340, "tx_prio3_pause": 4, "rx_prio3_pause_transition": 9}
    assert nic.parse_ethtool_pause("no stats available\n") == {}


def test_pause_is_skipped_with_its_reason(tmp_path):
    # fixture hosts have no `device` links: nothing physical to ask ethtool about
    assert nic.read_pause(SYSFS / "roce_host") == ({}, "no physical interface (lo, veth and bridges have no pause counters)")
    dev = tmp_path / "class" / "net" / "eth9"
    dev.mkdir(parents=True)
    (dev / "device").mkdir()
    counters, why = nic.read_pause(tmp_path)
    assert counters == {}
    if shutil.which("ethtool") is None:
        assert why == "ethtool is not installed"
    else:  # ethtool exists but eth9 does not: nothing read, and it says where it looked
        assert "eth9" in why


def test_congestion_counters_where_the_driver_has_them():
    got = nic.read_congestion(SYSFS / "roce_host")
    assert got == {"rdma:mlx5_0:1": {"np_cnp_sent": 120, "rp_cnp_handled": 95, "out_of_buffer": 3}}
    assert nic.read_congestion(SYSFS / "nordma_host") == {}
    before = {"rdma:mlx5_0:1": {"np_cnp_sent": 100, "out_of_buffer": 5}}
    assert nic._delta(before, got) == {"rdma:mlx5_0:1": {"np_cnp_sent": 20, "rp_cnp_handled": None, "out_of_buffer": None}}


def _node(tx_by_rail, window=2.0):
    c0 = {r: (0, 0) for r in tx_by_rail}
    c1 = {r: (tx, tx) for r, tx in tx_by_rail.items()}
    return nic.summarize([(0.0, c0, window, c1)], list(tx_by_rail))


def test_line_rate_per_rail_and_while_communicating():
    s = _node({"rdma:mlx5_0:1": 25_000_000_000})  # 25 GB in 2 s = 100 Gbit/s
    nic.add_line_rate(s, {"rdma:mlx5_0:1": 2e11}, comm_window_s=1.25)
    v = s["per_rail"]["rdma:mlx5_0:1"]
    assert v["line_rate(Gbit/s)"] == 200 and v["tx_gbit_per_s"] == 100 and v["tx_pct_line"] == 50
    assert v["comm_tx_gbit_per_s"] == 160 and v["comm_tx_pct_line"] == 80  # 200 Gbit over 1.25 s
    unknown = _node({"net:lo": 10})
    nic.add_line_rate(unknown, {}, None)
    assert unknown["per_rail"]["net:lo"]["tx_pct_line"] is None and "comm_tx_gbit_per_s" not in unknown["per_rail"]["net:lo"]


def test_jain_over_all_nodes_and_per_node():
    a = _node({"rdma:mlx5_0:1": 100, "rdma:mlx5_1:1": 100})
    b = _node({"rdma:mlx5_0:1": 400, "rdma:mlx5_1:1": 0})
    block = nic.combine_nodes([a, b])
    assert block["jain_index_per_node"] == [1.0, 0.5]
    # x = [200, 200, 800, 0] bytes (tx + rx): (1200)^2 / (4 x (4e4 + 4e4 + 6.4e5)) = 0.5
    assert block["jain_index"] == pytest.approx(0.5) and block["rails_all_nodes"] == 4
    assert [n["node"] for n in block["nodes"]] == [0, 1] and block["per_rail"] == a["per_rail"]
    rows = dict(nic.summary_rows(block))
    assert rows["NIC fairness"] == "Jain 0.500 over 4 rail(s) of 2 node(s)"


def test_sampler_off_reads_nothing_and_on_reads_congestion_once():
    off = nic.NicSampler(root=str(SYSFS / "roce_host"), enabled=False)
    off.begin_step()
    off.end_step()
    assert off.steps == [] and off._extra is None
    on = nic.NicSampler(root=str(SYSFS / "roce_host"))
    on.begin_step()
    on.end_step()
    s = on.summary(["rdma:mlx5_0:1"], {"rdma:mlx5_0:1": 1e11})
    assert s["congestion"] == {"rdma:mlx5_0:1": {"np_cnp_sent": 0, "rp_cnp_handled": 0, "out_of_buffer": 0}}
    assert s["pause"] == {} and "no physical interface" in s["pause_skipped"]


# /proc/net/dev as net/core/net-procfs.c's dev_seq_show writes it: two header lines, then per
# interface 8 receive fields (bytes first) and 8 transmit fields (bytes first)
PROC_NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
  eth0: 7729725306 5123456    0    0    0     0          0         0  8947280   91234    0    0    0     0       0          0
    lo: 27859243111 5028685    0    0    0     0          0         0 27859243111 5028685    0    0    0     0       0          0
"""


def test_proc_net_dev_gives_tx_then_rx_bytes_per_interface():
    assert nic.parse_proc_net_dev(PROC_NET_DEV) == {"net:eth0": (8947280, 7729725306),
                                                    "net:lo": (27859243111, 27859243111)}


def test_a_host_read_is_one_instant_under_traffic():
    """lo counts each byte sent in tx and rx at once, so one snapshot has tx == rx even while
    traffic flows; two sysfs files read apart did not (a step once got 861 KB of other jobs'
    loopback traffic in tx and not rx). Loopback traffic flows while it reads."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    stop = threading.Event()

    def pump():
        buf = b"x" * 65536
        try:
            while not stop.is_set():
                cli.sendall(buf)
        except OSError:  # shut down below while blocked in sendall: how it is told to stop
            pass

    def drain():
        try:
            while not stop.is_set():
                if not peer.recv(1 << 20):
                    return
        except OSError:
            pass

    threads = [threading.Thread(target=pump, daemon=True), threading.Thread(target=drain, daemon=True)]
    for t in threads:
        t.start()
    try:
        # 300 reads at least, and on until the counters moved: on a loaded machine all 300 once fell
        # before the pump thread ran (a full run's failure), and the check below saw no traffic
        reads, deadline = [], time.monotonic() + 60
        while len(reads) < 300 or (reads[-1][0] == reads[0][0] and time.monotonic() < deadline):
            reads.append(nic.read_counters()["net:lo"])
    finally:
        # Shut down, join, then close: closing a socket a thread is blocked on gave that thread
        # EBADF (an unhandled-exception warning under a later test).
        stop.set()
        for s in (cli, peer):
            s.shutdown(socket.SHUT_RDWR)
        for t in threads:
            t.join(10)
        cli.close(), peer.close(), srv.close()
    assert not any(t.is_alive() for t in threads)
    assert reads[-1][0] > reads[0][0]  # traffic flowed while it read
    assert all(tx == rx for tx, rx in reads), [r for r in reads if r[0] != r[1]][:3]
