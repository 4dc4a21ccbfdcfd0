"""Line rate and every node's NIC counters across real emulated nodes (root): two network
namespaces joined by a veth shaped with tbf at 100 Mbit/s, one rank in each, the real
collectives and training entry points through the emulator (the runs of the emulated A/B
study, tests/conftest.py emu_ab; each cell's output is its log).

At 2 ranks busbw = S/t and each rank sends S bytes per all_reduce, so busbw is the link's
TCP payload rate: 100 Mbit/s x 1448/1514 = 0.01195 GB/s, i.e. 95.6% of the 0.0125 GB/s
line rate (tbf counts whole 1514-byte frames; workloads/fabric/linerate.py)."""

import sys

import pytest

from helpers import REPO, cpu_share, records_in

EMULATE = [sys.executable, str(REPO / "launch" / "emulate.py")]
PAYLOAD_PCT = 100 * 1448 / 1514  # 95.64


def _all_shaped(emu_ab, workload: str) -> list[dict]:
    """The emu-100m runs of `workload` in the study, in the order they ran."""
    recs = [r for r in records_in(emu_ab[0] / "emu-ab") if r["workload"] == workload and r["fabric"]["name"] == "emu-100m"]
    return sorted(recs, key=lambda r: r["study"]["position"])


def _shaped(emu_ab, workload: str) -> tuple[dict, str]:
    """The first emu-100m run of `workload` in the study, and its output (the cell's log)."""
    out = emu_ab[0] / "emu-ab"
    rec = _all_shaped(emu_ab, workload)[0]
    log = out / "logs" / f"{rec['run_id']}.log"
    return rec, log.read_text()


@pytest.fixture
def emu_collectives(emu_ab):
    return _shaped(emu_ab, "collectives")


@pytest.mark.timing  # a measured rate against the line rate
@pytest.mark.requires("root")
@pytest.mark.slow
def test_percent_of_line_rate_is_the_shaped_payload_rate(emu_ab, emu_collectives):
    rec, out = emu_collectives
    lr = rec["line_rate"]
    assert lr["per_comm(GB/s)"] == pytest.approx(0.0125) and lr["payload_per_comm(GB/s)"] == pytest.approx(0.0119551, abs=1e-7)
    assert [n["rails"] for n in lr["nodes"]] == [{"net:emu0": 1e8}, {"net:emu0": 1e8}]
    pct = rec["metrics"]["all_reduce/avg_busbw(%line)"]
    # Issue 16's bound: within 5% of the payload ceiling (>= 90.9% of the line rate). Measured
    # 93.0-95.0% here at load ~2; 90.3% once while eight jobs shared the 2 cores (the reverse
    # direction's ACKs share the shaped egress, ~2%, and the ring's phases leave gaps). The link
    # is a ceiling that CPU contention can only keep a trial from reaching (one CI trial: 77%,
    # its siblings 95%), so the bound is on the study's best shaped trial, and none above it.
    trials = [r["metrics"]["all_reduce/avg_busbw(%line)"] for r in _all_shaped(emu_ab, "collectives")]
    assert len(trials) == 3 and max(trials) <= 1.05 * PAYLOAD_PCT, trials
    assert abs(max(trials) - PAYLOAD_PCT) <= 0.05 * PAYLOAD_PCT, (trials, cpu_share.state(), out[-2000:])
    (row,) = rec["rows"]
    assert row["in_place"]["pct_line_rate"] == pytest.approx(pct)
    assert lr["above_line_rate"] == []  # Gloo's ring cannot beat the link
    assert "line rate 0.0125 GB/s per communicator" in out and "TCP payload ceiling 0.011955 GB/s" in out
    assert "%line" in out and row["stability"]["samples"] == rec["config"]["collectives"]["sample_iters"]


@pytest.mark.timing  # shares emu_collectives with the line-rate test
@pytest.mark.requires("root")
@pytest.mark.slow
def test_both_namespaces_counters_are_gathered(emu_collectives):
    rec, out = emu_collectives
    nodes = rec["nic"]["nodes"]
    assert [n["node"] for n in nodes] == [0, 1] and all(n["rails"] == ["net:emu0"] for n in nodes)
    for n in nodes:
        v = n["per_rail"]["net:emu0"]
        # at least the 20 timed all_reduces of 1 MiB left each namespace through its own veth end
        assert v["tx_bytes"] >= 20 * 2**20 and v["rx_bytes"] >= 20 * 2**20, v
        assert v["line_rate(Gbit/s)"] == pytest.approx(0.1) and 0 < v["tx_pct_line"] <= 100
        assert n["pause"] == {} and "no physical interface" in n["pause_skipped"]
    # the ring sends the same bytes each way: an even spread over the 2 rails of 2 nodes
    assert rec["nic"]["jain_index"] > 0.95 and rec["nic"]["rails_all_nodes"] == 2
    assert "NIC node 1" in out and "over 2 rail(s) of 2 node(s)" in out


@pytest.mark.timing  # shares emu_ab (one study per worker)
@pytest.mark.requires("root")
@pytest.mark.slow
def test_training_gathers_both_namespaces_and_its_comm_window_rate(emu_ab):
    """Training's NIC block: both namespaces, each rail as % of the shaped line rate, and the
    rate while gradients were in flight, which cannot be below the whole step's average."""
    rec, log = _shaped(emu_ab, "pretrain")
    nodes = rec["nic"]["nodes"]
    assert len(nodes) == 2 and rec["nic"]["jain_index_per_node"] == [1.0, 1.0]
    for n in nodes:
        v = n["per_rail"]["net:emu0"]
        assert v["line_rate(Gbit/s)"] == pytest.approx(0.1)
        # The comm window is the process's view; bytes the kernel sends after a call returned
        # still count, so the in-flight rate can read a little over the line (105.7% seen).
        assert 0 < v["tx_pct_line"] <= v["comm_tx_pct_line"] <= 120, v
    assert "NIC node 1" in log and "while communicating" in log
