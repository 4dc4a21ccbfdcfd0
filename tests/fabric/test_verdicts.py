"""Transport verdicts from NCCL/RCCL logs (fixtures written from their format strings, each
file's header names the source line): a rank with no channel yet, fabric=pcie against NVLink,
XGMI and bridged boxes, and the net plugin a profile can pin."""

from __future__ import annotations

from helpers.profiles import NCCL_LOGS, evidence, profile
from workloads.fabric import verify
from workloads.fabric.profile import FabricProfile


def test_no_channel_yet_is_unverified_not_ok():
    d = verify.decide(profile("roce"), evidence("nccl_2.22_lazy_connect"), environ={})
    assert d["verdict"] == "unverified"
    assert "ranks 0, 1 logged no channel" in d["message"]
    # a profile without channel rules has nothing to check there
    bare = FabricProfile("roce-net-only", "nccl", expect={"network": "IB", "link_layer": "RoCE"})
    assert verify.decide(bare, evidence("nccl_2.22_lazy_connect"), environ={})["verdict"] == "ok"


def test_pcie_label_rejects_an_nvlink_box():
    d = verify.decide(profile("pcie"), evidence("nccl_nvlink_box"), environ={})
    assert d["verdict"] == "mismatch"
    assert "ranks 0–3 found intra-node paths of type NVL" in d["message"]
    assert verify.decide(profile("pcie"), evidence("nccl_pcie"), environ={})["verdict"] == "ok"
    assert profile("pcie").env["NCCL_NVLS_ENABLE"] == "0"


def test_pcie_label_without_graph_lines_is_unverified():
    p = profile("pcie")
    ranks = [e["log"] | {"graph_types": []} for e in evidence("nccl_pcie")]
    d = verify.decide(p, [{"kind": "nccl", "log": r} for r in ranks], environ={})
    assert d["verdict"] == "unverified" and "logged no GRAPH line" in d["message"]


def _pcie_verdict(case: str) -> dict:
    from helpers.profiles import evidence, profile
    from workloads.fabric import verify

    return verify.decide(profile("pcie"), evidence(case), environ={})


def test_pcie_label_rejects_an_xgmi_box():
    """RCCL names the NVLink path type XGMI (rccl src/graph/topo.cc:27) and P2P/IPC reads the
    same over XGMI and PCIe: the fixture passed fabric=pcie before XGMI was forbidden."""
    from workloads.fabric import nccl_log

    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "rccl_2.21_xgmi"))
    assert (s["library"], s["version"]) == ("RCCL", "2.21.5-0cbce2a7")  # "RCCL version : x" (init.cc:719)
    assert s["graph_types"] == ["XGMI"] and s["gpu_links"] == ["XGMI"] and s["channels"] == {"P2P/IPC": 8}
    d = _pcie_verdict("rccl_2.21_xgmi")
    assert d["verdict"] == "mismatch" and "XGMI" in d["message"]


def test_pcie_label_rejects_nvlink_bridged_pairs_that_the_graph_line_hides():
    """NCCL 2.30.7, H100 NVL bridged in pairs: the ring's GRAPH type is its worst hop (PXB), so
    only the topology dump's `+ NVL[..] - DEV/..` links show the NVLink hops."""
    from workloads.fabric import nccl_log

    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "nccl_2.30_nvlink_bridged"))
    assert s["graph_types"] == ["PXB"] and s["gpu_links"] == ["NVL"]
    assert s["gpu_pci(GB/s)"] == 24.0  # "+ PCI[24.0] - DEV/..": gen4 x16 as NCCL rates it (the PCIe ceiling)
    d = _pcie_verdict("nccl_2.30_nvlink_bridged")
    assert d["verdict"] == "mismatch" and "NVL links between GPUs" in d["message"]
    # a true PCIe box (no GPU links in its dump) still passes; LOC/PCI links are not GPU fabric
    assert _pcie_verdict("nccl_pcie")["verdict"] == "ok"
    lg = nccl_log.parse_text("h:1:2 [0] NCCL INFO   + LOC[5000.0] - GPU/0-180000\n"
                             "h:1:2 [0] NCCL INFO + PCI[24.0] - GPU/0-18000 (0)\n")
    assert lg.gpu_links == []


def test_net_plugin_is_recorded_and_a_profile_can_pin_it():
    from helpers.profiles import evidence, profile
    from workloads.fabric import nccl_log, verify

    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "nccl_ib_plugin"))
    assert (s["plugin"], s["plugin_api"]) == ("NCCL RDMA Plugin v8", 8)
    assert s["plugin_path"] == "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"
    # 2.30.7's wording (plugin/net.cc:126)
    lg = nccl_log.parse_text("h:1:2 [0] NCCL INFO Successfully loaded external network plugin /usr/lib/libnccl-net-ofi.so\n"
                             "h:1:2 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)\n")
    assert (lg.plugin, lg.plugin_api, lg.plugin_path) == ("Libfabric", 10, "/usr/lib/libnccl-net-ofi.so")
    assert verify.decide(profile("ib"), evidence("nccl_ib_plugin"), environ={})["verdict"] == "ok"  # not pinned
    d = verify.decide(profile("ib", plugin="none"), evidence("nccl_ib_plugin"), environ={})
    assert d["verdict"] == "mismatch"
    assert "loaded net plugin 'NCCL RDMA Plugin v8' from /opt/hpcx/" in d["message"] and "expected plugin: none" in d["message"]
    assert verify.decide(profile("ib", plugin="RDMA Plugin"), evidence("nccl_ib_plugin"), environ={})["verdict"] == "ok"
    d = verify.decide(profile("roce", plugin="spcx"), evidence("nccl_roce"), environ={})
    assert d["verdict"] == "mismatch" and "loaded no net plugin" in d["message"]


def test_a_loaded_plugin_that_failed_init_does_not_pass_expect_plugin():
    """NCCL 2.30.7 loads a plugin at dlopen and initialises it per communicator; when init
    fails it moves on to its internal IB (plugin/net.cc:208,228,299). The record must say the
    plugin was not used, and a profile that pins it must fail."""
    from helpers.profiles import evidence, profile
    from workloads.fabric import nccl_log, verify

    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "nccl_2.30_plugin_fallback"))
    assert s["plugin"] is None and s["plugin_loaded"] == "AWS Libfabric" and s["networks"] == ["IB"]
    assert s["plugin_failed"].startswith("AWS Libfabric: NCCL logged 'Failed to initialize NET plugin'")
    d = verify.decide(profile("ib", plugin="Libfabric"), evidence("nccl_2.30_plugin_fallback"), environ={})
    assert d["verdict"] == "mismatch" and "did not run on the net plugin (AWS Libfabric" in d["message"]
    # NCCL's own IB ran: a profile asking for no plugin is satisfied
    assert verify.decide(profile("ib", plugin="none"), evidence("nccl_2.30_plugin_fallback"),
                         environ={})["verdict"] == "ok"
    # before 2.27/2.28 nothing but "Using network" tells: the internal IB after a loaded plugin
    old = nccl_log.parse_text("h:1:2 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v8)\n"
                              "h:1:2 [0] NCCL INFO Using network IB\n")
    assert old.plugin is None and "ran on NCCL's internal IB" in old.plugin_failed
    # the RDMA/SHARP plugin loads as "NCCL RDMA Plugin v8" and runs as IBext_v8: in use
    sharp = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "nccl_ib_plugin"))
    assert sharp["plugin"] == "NCCL RDMA Plugin v8" and sharp["plugin_failed"] is None


# ---------------------------------------------------------------------------------------
# The verdict is decided on each problem's kind, never on its wording: "unverified" only when
# every problem is missing evidence, "mismatch" as soon as one contradicts the label.


def test_problem_kinds_are_checked():
    import pytest

    assert verify.Problem("unverified", "x") == verify.unverified("x")
    with pytest.raises(ValueError, match="not one of"):
        verify.Problem("unverifed", "x")


def test_verdict_of_problem_kinds():
    assert verify.verdict_of([]) == "ok"
    assert verify.verdict_of([verify.unverified("a"), verify.unverified("b")]) == "unverified"
    assert verify.verdict_of([verify.unverified("a"), verify.mismatch("b")]) == "mismatch"


def test_each_rule_names_its_kind():
    silent = verify.nccl_problems({"network": "IB"}, [{"lines": 0}, {"lines": 3, "network": "Socket"}])
    assert [(p.kind, p.text) for p in silent] == [("unverified", "rank 0 wrote no NCCL INFO log"),
                                                  ("mismatch", "rank 1 used NET/Socket")]
    lazy = verify.nccl_problems(profile("roce").expect, [e["log"] for e in evidence("nccl_2.22_lazy_connect")])
    assert {p.kind for p in lazy} == {"unverified"}
    lonely = verify.gloo_problems({}, [{"rank": 0, "peer_connections": 0, "interfaces": []},
                                       {"rank": 1, "peer_connections": 0, "interfaces": []}])
    assert [p.kind for p in lonely] == ["unverified"]


def test_a_mismatch_that_reads_like_missing_evidence_stays_a_mismatch():
    """The wording of a problem can quote what a log said (a plugin's name, an interface): the
    verdict must not change with it. Under the old substring marks this plugin made the run
    'unverified' instead of 'mismatch'."""
    ranks = [{"lines": 3, "rank": 0, "plugin": "wrote no NCCL INFO log"}]
    d = verify.decide(FabricProfile("pinned", "nccl", expect={"plugin": "none"}),
                      [{"kind": "nccl", "log": r} for r in ranks], environ={})
    assert d["verdict"] == "mismatch" and "loaded net plugin 'wrote no NCCL INFO log'" in d["message"]


def test_a_missing_rank_log_does_not_hide_a_mismatch(tmp_path):
    """A server with fewer rank logs than ranks is unverified, unless a log it has shows the
    wrong transport: then it is a mismatch, and both are said."""
    import shutil

    from workloads.fabric import verify_server

    shutil.copytree(NCCL_LOGS / "nccl_socket_fallback", tmp_path / "nccl")
    logs = len(list((tmp_path / "nccl").glob("*.log")))
    d = verify_server.server_transport(profile("roce"), tmp_path, ranks=logs + 2)
    assert d["verdict"] == "mismatch"
    assert "NET/Socket" in d["message"] and "2 rank log(s) missing" in d["message"]
