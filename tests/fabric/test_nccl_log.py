"""NCCL/RCCL INFO-log parsing and the transport verdict, from fixture logs written in the
formats NCCL 2.18-2.23 and RCCL 2.18 print (tests/fixtures/nccl_logs/, one file per process)."""



import pytest
import yaml

from helpers import FIXTURES, REPO
from helpers.profiles import NCCL_LOGS, evidence
from helpers.profiles import profile as expecting
from workloads.core.dist import DistInfo
from workloads.core.errors import TransportMismatch
from workloads.fabric import nccl_log, nic, verify
from workloads.fabric.profile import FabricProfile

FIX = FIXTURES
LOGS = FIX / "nccl_logs"
CONF = REPO / "conf" / "fabric"


def profile(name: str, **over) -> FabricProfile:
    cfg = yaml.safe_load((CONF / f"{name}.yaml").read_text()) | over
    return FabricProfile.from_config(cfg)


def test_transport_key_and_family():
    assert nccl_log.transport_key("NET/IB/0(1)/GDRDMA") == ("NET/IB", True)
    assert nccl_log.transport_key("NET/Socket/1") == ("NET/Socket", False)
    assert nccl_log.transport_key("NET/IBext_v8/3") == ("NET/IBext_v8", False)
    assert nccl_log.transport_key("P2P/CUMEM/read") == ("P2P/CUMEM", False)
    assert nccl_log.transport_key("P2P/direct pointer") == ("P2P/direct pointer", False)
    assert nccl_log.transport_key("SHM/direct/direct") == ("SHM", False)
    assert [nccl_log.network_family(n) for n in ("IB", "IBext_v8", "Socket", "AWS Libfabric")] == \
        ["IB", "IB", "Socket", "AWS Libfabric"]


def test_roce_summary_and_verdict_ok():
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_roce"))
    assert (s["library"], s["version"], s["networks"]) == ("NCCL", "2.21.5+cuda12.4", ["IB"])
    assert [(d["name"], d["port"], d["link_layer"]) for d in s["devices"]] == [("mlx5_0", 1, "RoCE"), ("mlx5_1", 1, "RoCE")]
    # 2 ranks x 2 channels, counted once each (on the sender); every one GPUDirect RDMA
    assert s["channels"] == {"NET/IB": 4} and s["gdr"] is True
    assert [r["rank"] for r in s["ranks"]] == [0, 1] and {r["oob"] for r in s["ranks"]} == {"eth0:10.0.0.1", "eth0:10.0.0.2"}
    d = verify.decide(profile("roce"), evidence("nccl_roce"), environ={})
    assert d["verdict"] == "ok" and d["message"] is None
    # the same log under the ib label: link layer RoCE is not IB
    d = verify.decide(profile("ib"), evidence("nccl_roce"), environ={}, root=FIX / "sysfs" / "roce_host")
    assert d["verdict"] == "mismatch"
    assert "ranks 0, 1 used mlx5_0:1/RoCE, mlx5_1:1/RoCE (link layer is not IB)" in d["message"]


def test_ib_plugin_counts_as_ib():
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_ib_plugin"))
    assert s["networks"] == ["IBext_v8"] and s["plugin"].startswith("NCCL RDMA Plugin v8")
    assert s["devices"][0] == {"name": "mlx5_0", "port": 1, "link_layer": "IB", "features": ["SHARP"], "index": 0}
    assert s["channels"] == {"NET/IBext_v8": 4, "P2P/CUMEM": 2} and s["gdr"] is True  # PXN line `/0(1)/` too
    assert verify.decide(profile("ib"), evidence("nccl_ib_plugin"), environ={})["verdict"] == "ok"
    # a socket-labelled run must not pass on an IB plugin
    d = verify.decide(profile("socket"), evidence("nccl_ib_plugin"), environ={})
    assert "used NET/IBext_v8" in d["message"] and "have channels via NET/IBext_v8" in d["message"]


def test_socket_fallback_under_roce_label_fails_with_one_message():
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_socket_fallback"))
    assert s["networks"] == ["Socket"] and s["no_device"] == ["IB"] and s["gdr"] is False
    assert s["channels"] == {"NET/Socket": 2, "P2P/IPC": 6}
    p = profile("roce")
    env = {"NCCL_IB_HCA": "mlx5_9"}
    d = verify.decide(p, evidence("nccl_socket_fallback"), environ=env, root=FIX / "sysfs" / "roce_host")
    assert d["verdict"] == "mismatch"
    assert d["message"] == (
        "fabric=roce but ranks 0–7 used NET/Socket; ranks 0, 3, 4, 7 have channels via NET/Socket; "
        "NCCL said 'NET/IB : No device found'; NCCL_IB_HCA=mlx5_9 matched no RDMA device; "
        "present: mlx5_0:1 (RoCE, ACTIVE), mlx5_1:1 (RoCE, ACTIVE)")
    # the same evidence labelled socket is fine
    assert verify.decide(profile("socket"), evidence("nccl_socket_fallback"), environ={})["verdict"] == "ok"


def test_a_real_nccl_2_28_log_from_one_h100():
    """Not written from format strings: NCCL 2.28.9's own log of a one-GPU run (gpu-check on an
    H100 VM). Its network is Socket (the IB plugin failed: NCCL_IB_DISABLE=1) and one rank
    connects no channel, so intranode is ok, while an RDMA profile names the fallback."""
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_2.28_h100_one_gpu"))
    assert s["version"] == "2.28.9+cuda13.0" and s["library"] == "NCCL" and s["processes"] == 1
    assert s["networks"] == ["Socket"] and [d["name"] for d in s["devices"]] == ["eth0"]
    assert s["channels"] == {} and s["net_channels"] == 0 and s["graph_types"] == ["LOC"]
    assert s["gpu_pci(GB/s)"] == 48.0  # "+ PCI[48.0] - GPU/0-60": gen5 x16, width x speed / 80
    assert verify.decide(profile("intranode"), evidence("nccl_2.28_h100_one_gpu"), environ={})["verdict"] == "ok"
    d = verify.decide(profile("roce"), evidence("nccl_2.28_h100_one_gpu"), environ={},
                      root=FIX / "sysfs" / "roce_host")
    assert d["verdict"] == "mismatch" and d["message"].startswith("fabric=roce but rank 0 used NET/Socket")


def test_rccl_flavour():
    logs = nccl_log.parse_dir(LOGS / "rccl_socket")
    assert [lg.rank for lg in logs] == [0, 1]  # from `rank r nranks 2`, not RCCL's `nRanks 02` trailer
    s = nccl_log.summarize(logs)
    assert (s["library"], s["version"]) == ("RCCL", "2.18.3+hip6.0")
    assert [d["name"] for d in s["devices"]] == ["hsn0", "hsn1"]
    assert s["channels"] == {"NET/Socket": 4}
    assert verify.decide(profile("socket"), evidence("rccl_socket"), environ={})["verdict"] == "ok"


def test_pcie_only_p2p_and_shm():
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_pcie"))
    assert s["channels"] == {"P2P/CUMEM": 2, "P2P/IPC": 2, "P2P/direct pointer": 2, "SHM": 2}
    assert s["net_channels"] == 0 and s["gdr"] is None
    assert verify.decide(profile("pcie"), evidence("nccl_pcie"), environ={})["verdict"] == "ok"
    # NET channels in a pcie-labelled run: forbidden, and outside allow_transports
    d = verify.decide(profile("pcie"), evidence("nccl_socket_fallback"), environ={})
    assert "ranks 0, 3, 4, 7 have channels via NET/Socket (allowed: P2P, SHM)" in d["message"]


def test_no_info_log_is_unverified_and_says_why():
    d = verify.decide(profile("roce"), evidence("nccl_warn_only"), environ={"NCCL_DEBUG": "WARN"})
    assert d["verdict"] == "unverified"
    assert d["message"].startswith("fabric=roce but rank 0 wrote no NCCL INFO log; NCCL_DEBUG=WARN")
    assert "fabric.verify=warn" in d["message"]


def test_check_transport_raises_or_warns(capsys):
    """The one call workloads make, in one process (world 1): its own log file is read
    through NCCL_DEBUG_FILE; fail raises TransportMismatch (exit code 3), warn prints."""
    info = DistInfo(0, 1, 0, 1, "nccl", None)
    env = {"NCCL_DEBUG_FILE": str(LOGS / "nccl_socket_fallback" / "nccl.node1.7000.log")}
    with pytest.raises(TransportMismatch) as e:
        verify.check_transport(profile("roce"), "/tmp/run", info, environ=env, root=FIX / "sysfs" / "nordma_host")
    assert str(e.value).startswith("fabric=roce but rank 0 used NET/Socket")
    assert "present: none (no /sys/class/infiniband" in str(e.value) and e.value.exit_code == 3
    r = verify.check_transport(profile("roce", verify="warn"), "/tmp/run", info, environ=env)
    assert r["verdict"] == "mismatch" and "fabric.verify=warn: continuing" in capsys.readouterr().out
    assert verify.check_transport(profile("roce", verify="off"), "/tmp/run", info, environ=env)["verdict"] == "off"


def test_rank_list():
    assert verify.rank_list([0, 1, 2, 3, 4, 5, 6, 7]) == "ranks 0–7"
    assert verify.rank_list([5, 0, 1, 2, 3]) == "ranks 0–3, 5"
    assert verify.rank_list([2]) == "rank 2"


def test_gdr_suffixes_are_gdr():
    for via in ("NET/IB/0/GDRDMA/Shared", "NET/IB/2/GDRDMA(PCI)", "NET/IB/1(1)/GDRDMA(PCI)/Shared",
                "NET/IB/0(1)/GDRDMA"):
        assert nccl_log.transport_key(via) == ("NET/IB", True), via
    assert nccl_log.transport_key("NET/IB/0/Shared") == ("NET/IB", False)
    assert nccl_log.transport_key("NET/Socket/0") == ("NET/Socket", False)


@pytest.mark.parametrize("case, fabric", [("nccl_2.20_roce_shared", "roce"), ("nccl_2.29_c2c_pci", "ib"),
                                          ("rccl_2.2x_ib", "roce")])
def test_gdr_runs_pass_expect_gdr(case, fabric):
    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / case))
    assert s["gdr"] is True and s["gdr_channels"] == s["net_channels"] > 0
    d = verify.decide(expecting(fabric, gdr=True), evidence(case), environ={})
    assert d["verdict"] == "ok", d["message"]


def test_fixture_counts_per_version():
    # 2.20 (2.18-2.25 form): 2 ring sends + 2 p2p /Shared sends per rank, counted on the sender
    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "nccl_2.20_roce_shared"))
    assert s["channels"] == {"NET/IB": 8} and s["version"] == "2.20.3+cuda12.3"
    # 2.29: PXN `(1)` and (PCI)/Shared sends, one CollNet send, the GRAPH line's NVL intra path
    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "nccl_2.29_c2c_pci"))
    assert s["channels"] == {"COLLNET": 1, "NET/IB": 6} and s["net_channels"] == 6
    assert s["collnet_channels"] == 1 and s["graph_types"] == ["NVL"]
    # RCCL 2.2x: the ` comm 0x... nRanks 02` trailer is cut, ranks come from `rank r nranks 2`
    logs = nccl_log.parse_dir(NCCL_LOGS / "rccl_2.2x_ib")
    assert [lg.rank for lg in logs] == [0, 1] and {lg.library for lg in logs} == {"RCCL"}
    assert nccl_log.summarize(logs)["channels"] == {"NET/IB": 6}


def test_rail_suffix_keeps_the_port_and_nic_rails_name_real_ports():
    s = nccl_log.summarize(nccl_log.parse_dir(NCCL_LOGS / "nccl_2.30_rail_suffix"))
    assert [(d["name"], d["port"], d["link_layer"]) for d in s["devices"]] == [("mlx5_0", 1, "IB"), ("mlx5_1", 1, "IB")]
    transport = verify.decide(profile("ib"), evidence("nccl_2.30_rail_suffix"), environ={})
    assert transport["verdict"] == "ok"
    assert nic.rails_for(profile("ib"), {}, transport) == ["rdma:mlx5_0:1", "rdma:mlx5_1:1"]


def test_merged_and_data_direct_devices_map_to_physical_rails():
    transport = {"summary": {"devices": [{"name": "mlx5_0+mlx5_1", "port": 1}, {"name": "mlx5_2_dma", "port": 1}]}}
    assert nic.rails_for(profile("ib"), {}, transport) == ["rdma:mlx5_0:1", "rdma:mlx5_1:1", "rdma:mlx5_2:1"]


def test_bootstrap_subsystem_is_logged_and_parsed():
    env: dict = {}
    profile("roce").apply("/tmp/fb-run", env)
    assert "BOOTSTRAP" in env["NCCL_DEBUG_SUBSYS"].split(",")
    logs = nccl_log.parse_dir(NCCL_LOGS / "nccl_2.22_lazy_connect")
    assert [lg.bootstrap for lg in logs] == ["eth0:10.0.0.1", "eth0:10.0.0.2"]
