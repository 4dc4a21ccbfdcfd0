"""The link workload's parsers and metrics against the tools' own output (tests/fixtures/link:
real iperf3 3.12 JSON; perftest tables written with perftest's own format strings, cited there),
with worked values, and its command lines."""

import pytest

from helpers import FIXTURES
from workloads import catalog
from workloads.fabric import linerate
from workloads.link.run import metrics, summary
from workloads.link.tools import TOOLS, Options, ToolFailed, load_iperf3, parse_iperf3, parse_perftest

LINK = FIXTURES / "link"


def _iperf(name: str) -> dict:
    return parse_iperf3(load_iperf3((LINK / name).read_text()))


def test_iperf3_client_sums_are_read_in_gbit_per_s():
    r = _iperf("iperf3-client-P2.json")
    # end.sum_sent.bits_per_second 6164788468.768248, end.sum_received 6072081676.817817
    assert r["sent(Gbit/s)"] == pytest.approx(6.164788468768248, rel=1e-12)
    assert r["received(Gbit/s)"] == pytest.approx(6.072081676817817, rel=1e-12)
    assert (r["retransmits"], r["bytes_sent"], r["bytes_received"]) == (28, 770703360, 761790464)
    assert r["seconds"] == pytest.approx(1.003663)
    assert (r["protocol"], r["streams"], r["reverse"], r["bidir_reverse"]) == ("TCP", 2, False, None)
    # received bytes x 8 / seconds is what iperf3 calls bits_per_second
    assert r["bytes_received"] * 8 / r["seconds"] / 1e9 == pytest.approx(r["received(Gbit/s)"], rel=1e-6)


def test_the_server_side_reports_the_same_received_total():
    c, s = _iperf("iperf3-client-P2.json"), _iperf("iperf3-server-P2.json")
    assert s["bytes_received"] == c["bytes_received"] and s["received(Gbit/s)"] == pytest.approx(c["received(Gbit/s)"])


def test_bidir_has_both_directions_and_metrics_name_the_reverse():
    r = _iperf("iperf3-client-bidir.json")
    assert r["sent(Gbit/s)"] == pytest.approx(4.646271636043548) and r["retransmits"] == 6
    rev = r["bidir_reverse"]
    assert rev["sent(Gbit/s)"] == pytest.approx(4.76086577953341) and rev["retransmits"] == 1
    assert rev["received(Gbit/s)"] == pytest.approx(4.710130154195568)
    m = metrics(r, None, None)
    assert m["reverse/throughput_received(Gbit/s)"] == pytest.approx(4.710130154195568)
    assert m["throughput_received(Gbit/s)"] == pytest.approx(4.616778092121663)


def test_an_iperf3_error_document_is_a_failure_in_its_own_words():
    # iperf3 3.12 exits 0 here: the document, not the exit status, says it failed
    with pytest.raises(ToolFailed, match="^iperf3: unable to connect to server: Connection refused$"):
        _iperf("iperf3-refused.json")
    with pytest.raises(ToolFailed, match=r"printed no JSON \(iperf3: error - unable"):
        load_iperf3("iperf3: error - unable to start listener for connections: Address already in use\n")
    with pytest.raises(ToolFailed, match="no end.sum_sent"):
        parse_iperf3({"start": {}, "end": {}})


def test_perftest_bw_in_gbit_per_s():
    r = parse_perftest((LINK / "ib_write_bw-report_gbits.txt").read_text())
    assert r["test"] == "RDMA_Write BW Test" and (r["device"], r["link_type"], r["transport_type"]) == ("mlx5_0", "IB", "IB")
    assert (r["size(B)"], r["iterations"]) == (65536, 5000)
    assert (r["bw_peak(Gbit/s)"], r["bw_average(Gbit/s)"], r["msg_rate(Mpps)"]) == (96.54, 96.48, 0.184021)
    # the message rate and the bandwidth agree: 96.48e9 / (65536 x 8) = 0.184021e6 messages/s
    assert r["bw_average(Gbit/s)"] * 1e9 / (r["size(B)"] * 8) / 1e6 == pytest.approx(r["msg_rate(Mpps)"], abs=1e-6)


def test_perftest_mib_per_s_is_converted_by_its_header_unit():
    r = parse_perftest((LINK / "ib_write_bw-mib.txt").read_text())
    # 11501.31 MiB/sec x 2^20 x 8 / 1e9 = 96.4799... Gbit/s (perftest's format_factor 0x100000)
    assert r["bw_average(Gbit/s)"] == pytest.approx(11501.31 * 2**20 * 8 / 1e9, rel=1e-12)
    assert r["bw_average(Gbit/s)"] == pytest.approx(96.48, abs=1e-4) and r["link_type"] == "Ethernet"


def test_perftest_latency_row():
    r = parse_perftest((LINK / "ib_read_lat.txt").read_text())
    assert r["test"] == "RDMA_Read Latency Test" and (r["size(B)"], r["iterations"]) == (2, 1000)
    assert [r[k] for k in ("lat_min(us)", "lat_max(us)", "lat_typical(us)", "lat_avg(us)", "lat_stdev(us)",
                           "lat_p99(us)", "lat_p99.9(us)")] == [1.63, 5.21, 1.68, 1.71, 0.12, 2.05, 5.21]
    m = metrics(r, 100.0, None)
    assert m["lat_typical(us)"] == 1.68 and "size(B)" not in m and "bw_average(%line)" not in m


def test_perftest_without_a_table_is_a_failure():
    with pytest.raises(ToolFailed, match="no result table"):
        parse_perftest(" Unable to find the Infiniband/RoCE device\n")


def test_percent_of_line_and_payload_rate_on_emu_100m():
    """The shaped link's line rate and payload ceiling come from workloads/fabric/linerate.py."""
    node = linerate.node_line_rate(["net:emu0"], {"rate": "100mbit", "mtu": 1500})
    job = linerate.job_line_rate([node, node], 1)
    line, payload = job["per_node(GB/s)"] * 8, job["payload_per_comm(GB/s)"] * 8
    assert line == pytest.approx(0.1) and payload == pytest.approx(0.1 * 1448 / 1514)
    result = {"sent(Gbit/s)": 0.0959, "received(Gbit/s)": 0.0956, "retransmits": 0, "bytes_received": 59750000,
              "seconds": 5.0}
    m = metrics(result, line, payload)
    assert m["throughput(%line)"] == pytest.approx(95.6)
    assert m["throughput(%payload)"] == pytest.approx(100 * 0.0956 / (0.1 * 1448 / 1514))  # 99.96
    line_text = summary("iperf3", m, {"client": "10.77.0.2", "server": "10.77.0.1:5201"})
    assert "received 0.0956 Gbit/s" in line_text and "100.0% of the TCP payload rate 0.09564" in line_text
    # a path whose rate is unknown (lo) has no percentages rather than a made-up one
    assert not any("%" in k for k in metrics(result, None, None))


def test_command_lines():
    o = Options(duration_s=3, omit_s=0.5, streams=4, window="4M", direction="reverse", port=6000)
    assert TOOLS["iperf3"].server_argv(o, "10.0.0.1") == [
        "iperf3", "-s", "-1", "-B", "10.0.0.1", "-p", "6000", "--json", "--idle-timeout", "60"]
    c = TOOLS["iperf3"].client_argv(o, "10.0.0.1")
    assert c[:10] == ["iperf3", "-c", "10.0.0.1", "-p", "6000", "-t", "3", "-O", "0.5", "-P"]
    assert c[10] == "4" and ["-w", "4M"] == c[c.index("-w"):c.index("-w") + 2] and c[-1] == "-R"
    assert TOOLS["iperf3"].client_argv(Options(direction="bidir"), "h")[-1] == "--bidir"
    p = Options(tool="ib_write_bw", device="mlx5_0", gid_index=3, size=65536, iters=5000, port=18515)
    assert TOOLS["ib_write_bw"].client_argv(p, "10.0.0.1") == [
        "ib_write_bw", "-p", "18515", "--report_gbits", "-d", "mlx5_0", "-x", "3", "-s", "65536", "-n", "5000",
        "10.0.0.1"]
    assert TOOLS["ib_read_lat"].server_argv(Options(), "x") == ["ib_read_lat", "-p", "5201", "--report_gbits"]


def test_catalog_primary_metric():
    primary = catalog.get("link").primary
    assert primary(["throughput_sent(Gbit/s)", "throughput_received(Gbit/s)"]) == "throughput_received(Gbit/s)"
    assert primary(["bw_average(Gbit/s)", "bw_peak(Gbit/s)"]) == "bw_average(Gbit/s)"
    assert primary(["lat_typical(us)"]) == "lat_typical(us)" and primary(["retransmits"]) is None


def test_every_link_figure_has_a_direction_for_compare():
    """fabricbench compare must know which way is better for each headline and rate figure."""
    from analysis.compare import direction

    it = metrics(_iperf("iperf3-client-bidir.json"), 10.0, 9.5)
    bw = metrics(parse_perftest((LINK / "ib_write_bw-report_gbits.txt").read_text()), 100.0, None)
    lat = metrics(parse_perftest((LINK / "ib_read_lat.txt").read_text()), None, None)
    assert direction("throughput_received(Gbit/s)") == (True, "faster") and direction("lat_typical(us)")[0] is False
    assert direction("reverse/retransmits") == (False, "better") and direction("throughput(%payload)")[0] is True
    for key in [*it, *bw, *lat, *catalog.get("link").headline]:
        if not key.endswith("bytes_received"):  # a count of what moved, neither better nor worse
            direction(key)
