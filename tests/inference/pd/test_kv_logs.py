"""The readers of a P/D server's own output, against fixtures in upstream formats (their headers
cite the source): UCX's transport lines and protocol tables (workloads/fabric/ucx_log.py) into
the KV-path verdict (verify_kv.py), and vLLM's KV-transfer metrics (workloads/inference/pd/kvlog.py)
against the model's KV size."""

from __future__ import annotations

import pytest

from helpers import REPO
from workloads.fabric import ucx_log
from workloads.fabric.profile import FabricProfile
from workloads.fabric.verify_kv import kv_verdict
from workloads.inference.pd import kvlog

UCX = REPO / "tests" / "fixtures" / "ucx_logs"
KV = REPO / "tests" / "fixtures" / "vllm_kv" / "nixl_kv_metrics_vllm_0.32.log"


def _text(name: str) -> str:
    return (UCX / name).read_text()


def test_cma_on_one_host():
    log = ucx_log.parse(_text("ucx_1.23_cma_loopback.log"))
    (get,) = log.op_rows()
    assert (get.scope, get.range, get.description, get.transports) == ("intra-node", "0..inf", "zero-copy", ["cma"])
    assert log.transports() == ["cma"]
    # active messages (NIXL's notifications) go over TCP on lo; only the GET carries the KV cache
    assert {t for r in log.rows if "active message" in r.operation for t in r.transports} == {"tcp"}
    (ep,) = log.endpoints
    assert ep.scope == "intra-node" and ep.cfg == 1 and ep.features["am"] == ["tcp", "cma"]
    assert ep.features["rma_am"] == ["tcp"]  # no one-sided RMA lane: UCX's rma emulated over AM


def test_tcp_only_is_software_emulation():
    (get,) = ucx_log.parse(_text("ucx_1.23_tcp_only.log")).op_rows()
    assert get.description == "software emulation" and get.transports == ["tcp"]


def test_interleaved_threads_and_rdma():
    log = ucx_log.parse(_text("ucx_rdma_inter_node.log"))
    assert log.transports() == ["rc_mlx5"]  # thread 1's AM table (tcp) is not the GET's
    assert [r.scope for r in log.op_rows()] == ["inter-node"]
    assert log.endpoints[0].features["ka"] == ["ud_mlx5"]


def test_ucx_1_21_table_layout():
    """UCX 1.18-1.21 print one two-cell title row and no header row (v1.21.0 proto_debug.c):
    the KV path must still be read, not reported as a missing UCX_PROTO_INFO."""
    log = ucx_log.parse(_text("ucx_1.21_old_table.log"))
    (small, large) = log.op_rows()
    assert (small.scope, small.range, small.description, small.transports) == (
        "inter-node", "0..8K", "zero-copy", ["rc_mlx5"])
    assert large.range == "8193..inf" and large.devices == ["mlx5_0:1", "mlx5_3:1"]
    assert "ucp_get*(multi)" in small.operation and log.transports() == ["rc_mlx5"]
    # the loopback (self) table is not between instances; the counted put row keeps its range
    (put,) = log.op_rows("put")
    assert put.range == "0..inf" and put.devices == ["mlx5_3:1"]
    v = kv_verdict(_profile(kv_transports=["rc_mlx5"], forbid_kv_transports=["tcp"]), _text("ucx_1.21_old_table.log"))
    assert v["verdict"] == "ok", v


def _profile(**expect) -> FabricProfile:
    return FabricProfile.from_config({"name": "f", "backend": "gloo", "expect": expect, "verify": "fail"})


@pytest.mark.parametrize("fixture,expect,verdict", [
    ("ucx_1.23_cma_loopback.log", {"kv_transports": ["cma", "tcp"]}, "ok"),
    ("ucx_1.23_tcp_only.log", {"kv_transports": ["tcp"]}, "ok"),
    ("ucx_1.23_tcp_only.log", {"kv_transports": ["rc_mlx5", "rc_verbs"]}, "mismatch"),   # RDMA expected
    ("ucx_1.23_tcp_only.log", {"forbid_kv_transports": ["tcp"]}, "mismatch"),
    ("ucx_rdma_inter_node.log", {"kv_transports": ["rc_mlx5"], "forbid_kv_transports": ["tcp"]}, "ok"),
    ("ucx_1.23_cma_loopback.log", {}, "ok"),
])
def test_kv_verdict(fixture, expect, verdict):
    v = kv_verdict(_profile(**expect), _text(fixture))
    assert v["verdict"] == verdict, v
    assert (v["message"] is None) == (verdict == "ok")
    if verdict == "mismatch":
        assert "tcp" in v["message"] and v["summary"]["kv_transports"] == ["tcp"]


def test_no_table_is_unverified():
    v = kv_verdict(_profile(kv_transports=["tcp"]), "UCX  INFO  Version 1.23.0\n")
    assert v["verdict"] == "unverified" and "UCX_PROTO_INFO" in v["message"]


def test_kv_metrics_lines():
    iv = kvlog.parse(KV.read_text())
    assert [i.transfers for i in iv] == [1, 1, 2, 0] and iv[3].failed == 1
    assert iv[0] == kvlog.KVInterval(1, 0.156, 0.156, 0.125, 0, 0)
    s = kvlog.summarize(iv)
    assert s["transfers"] == 4 and s["failed"] == 1
    # (0.125 + 0.125 + 2 x 0.25) MiB / 4 transfers
    assert s["bytes_per_transfer"] == round(0.1875 * 2**20)
    assert s["xfer_ms_mean"] == pytest.approx((0.156 + 5.867 + 2 * 3.0) / 4)
    assert s["xfer_ms_p90_max"] == 5.867
    assert kvlog.summarize([])["bytes_per_transfer"] is None


def test_kv_size_of_the_tiny_llama():
    """llama-tiny (conf/model/llama-tiny.yaml): 2 layers, 2 KV heads, head_dim 128/4 = 32, fp32;
    a 24-token prompt fills one of vLLM's 128-token CPU blocks: 2·2·2·32·4 B x 128 = 0.125 MiB,
    what the decode instance logged for it."""
    shape = kvlog.KVShape.from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                          "hidden_size": 128, "torch_dtype": "float32"})
    assert shape.bytes_per_token() == 1024
    assert shape.transfer_bytes(24, 128) == 0.125 * 2**20 == shape.transfer_bytes(128, 128)
    assert shape.transfer_bytes(129, 128) == 2 * 0.125 * 2**20
    assert kvlog.KVShape.from_hf_config({"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8},
                                        "bfloat16").bytes_per_token() == 2 * 1 * 2 * 4 * 2
    with pytest.raises(ValueError, match="unknown KV dtype"):
        kvlog.KVShape.from_hf_config({"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8}, "int3")


class _Observer:
    """What server=vllm-pd's observer gives the sweep: the verdict from a UCX log (here a fixture)."""

    def __init__(self, text: str):
        self.text = text

    def verify(self, fabric):
        return {"kv_path": kv_verdict(fabric, self.text)}


@pytest.mark.parametrize("mode", ["fail", "warn"])
def test_a_kv_mismatch_stops_the_sweep_like_a_transport_one(mode, capsys):
    """run.py's _verify_observed: the verdict goes beside the transport's in the record; under
    fabric.verify=fail a mismatch raises TransportMismatch (exit 3), under warn it is printed."""
    from workloads.core.errors import TransportMismatch
    from workloads.inference.run import _verify_observed

    profile = FabricProfile.from_config({"name": "ib", "backend": "nccl", "verify": mode,
                                         "expect": {"forbid_kv_transports": ["tcp"]}})
    base = {"fabric": {}}
    obs = _Observer(_text("ucx_1.23_tcp_only.log"))
    if mode == "fail":
        with pytest.raises(TransportMismatch, match="fabric=ib but the KV cache was read over tcp"):
            _verify_observed(profile, obs, base)
    else:
        _verify_observed(profile, obs, base)
        assert "warning: fabric=ib but the KV cache was read over tcp" in capsys.readouterr().out
    assert base["fabric"]["kv_path"]["verdict"] == "mismatch"


# Two tables in UCX's format (as in the fixtures): a process's `self` endpoint (NIXL's loopback
# notifications; no KV between instances) and an intra-node PUT (push mode's KV write).
SELF_AND_PUT = """\
[1795737172.1] [vm:13945:0]   +--------+-------------+-------------+
[1795737172.1] [vm:13945:0]   | d0c7 self cfg#0                    |
[1795737172.1] [vm:13945:0]   | remote memory read by ucp_get*(multi) into host memory from host |
[1795737172.1] [vm:13945:0]   +--------+-------------+-------------+
[1795737172.1] [vm:13945:0]   | Range  | Description |   Config    |
[1795737172.1] [vm:13945:0]   +--------+-------------+-------------+
[1795737172.1] [vm:13945:0]   | 0..inf | zero-copy   | self/memory |
[1795737172.1] [vm:13945:0]   +--------+-------------+-------------+
[1795737172.2] [vm:13945:0]   +--------+-------------+-------------+
[1795737172.2] [vm:13945:0]   | d0c7 intra-node cfg#1              |
[1795737172.2] [vm:13945:0]   | remote memory write by ucp_put* from host memory to host |
[1795737172.2] [vm:13945:0]   +--------+-------------+-------------+
[1795737172.2] [vm:13945:0]   | Range  | Description |   Config    |
[1795737172.2] [vm:13945:0]   +--------+-------------+-------------+
[1795737172.2] [vm:13945:0]   | 0..inf | zero-copy   | cma/memory  |
[1795737172.2] [vm:13945:0]   +--------+-------------+-------------+
"""


def test_self_endpoints_are_not_the_kv_path_and_push_mode_reads_puts():
    log = ucx_log.parse(SELF_AND_PUT)
    assert log.op_rows("get") == [] and log.transports("put") == ["cma"]
    assert kv_verdict(_profile(kv_transports=["cma"]), SELF_AND_PUT)["verdict"] == "unverified"
    v = kv_verdict(_profile(kv_transports=["cma"]), SELF_AND_PUT, op="put")
    assert v["verdict"] == "ok" and v["summary"]["op"] == "remote memory write by ucp_put*"
    bad = kv_verdict(_profile(kv_transports=["rc_mlx5"]), SELF_AND_PUT, op="put")
    assert "the KV cache was written over cma" in bad["message"]


def test_kv_devices_name_the_link():
    """emu-* expects tcp on emu0: the tcp-only fixture's GET went over tcp/lo, which is the right
    transport on the wrong interface (it would not cross an emulated link)."""
    log = ucx_log.parse(_text("ucx_1.23_tcp_only.log"))
    assert log.devices() == ["lo"] and log.op_rows()[0].devices == ["lo"]
    assert ucx_log.parse(_text("ucx_1.23_cma_loopback.log")).devices() == ["memory"]  # cma/memory
    on_lo = kv_verdict(_profile(kv_transports=["tcp"], kv_devices=["emu0"]), _text("ucx_1.23_tcp_only.log"))
    assert on_lo["verdict"] == "mismatch" and "through lo (UCX), not one of kv_devices=['emu0']" in on_lo["message"]
    assert on_lo["summary"]["kv_devices"] == ["lo"] and on_lo["expect"]["kv_devices"] == ["emu0"]
    emu = _text("ucx_1.23_tcp_only.log").replace("tcp/lo", "tcp/emu0")
    assert kv_verdict(_profile(kv_transports=["tcp"], kv_devices=["emu0"]), emu)["verdict"] == "ok"
    cma = kv_verdict(_profile(kv_transports=["tcp"], kv_devices=["emu0"]), _text("ucx_1.23_cma_loopback.log"))
    assert cma["verdict"] == "mismatch" and "read over cma" in cma["message"]


def test_link_crossing_worked_values():
    # 5 requests of one 128-token block of llama-tiny's 1 KiB a token: 655360 B of KV cache
    kv = 5 * 128 * 1024
    ok = kvlog.link_crossing("emu0", (1000, 500), (1000 + 700000, 500 + 40000), kv)
    assert (ok["tx_bytes"], ok["rx_bytes"], ok["verdict"], ok["message"]) == (700000, 40000, "ok", None)
    assert ok["ratio"] == pytest.approx(700000 / 655360)
    # CMA between the namespaces' processes: only the notifications and HTTP crossed
    gone = kvlog.link_crossing("emu0", (0, 0), (30000, 20000), kv)
    assert gone["verdict"] == "not_crossed" and "did not cross the emulated link" in gone["message"]
    assert kvlog.link_crossing("emu0", (0, 0), (500000, 0), kv)["verdict"] == "short"  # 0.76 of it
    assert kvlog.link_crossing("emu0", (0, 0), (10, 0), 0)["verdict"] == "unverified"
    back = kvlog.link_crossing("rdma:mlx5_0:1", (2**34, 0), (5000, 0), kv)  # a reset or a 32-bit counter's wrap
    assert back["verdict"] == "unverified" and back["message"] == "rdma:mlx5_0:1's tx counter went backwards during the point"


def test_predicted_transfer_time_worked_value():
    # 131072 B at 100 Mbit/s with 1448 B of TCP payload per 1514 B frame: 131072 / 11955085.9 B/s = 10.964 ms
    assert kvlog.predicted_xfer_ms(131072, 1e8, 1448 / 1514) == pytest.approx(10.9638, abs=1e-3)


def test_ttft_split_worked_values():
    """Two measured requests: prefill legs 300 and 500 ms, decode legs to the first chunk 150 and
    250 ms, client TTFTs 0.5 and 0.8 s; vLLM's mean KV transfer 120 ms. Means: TTFT 650, prefill
    400, decode 200, outside 650 - 400 - 200 = 50; the decode leg's rest 200 - 120 = 80."""
    legs = [{"prefill_s": 0.3, "decode_first_s": 0.15}, {"prefill_s": 0.5, "decode_first_s": 0.25}]
    assert kvlog.ttft_split(legs, [0.5, 0.8], 120.0) == {
        "requests": 2, "ttft": 650.0, "prefill_leg": 400.0, "decode_to_first_chunk": 200.0, "outside_legs": 50.0,
        "kv_xfer": 120.0, "decode_first_step_and_wait": 80.0}
    assert "kv_xfer" not in kvlog.ttft_split(legs, [0.5, 0.8], None)
    # legs that do not pair one to one with the completed requests, or a decode leg never answered
    assert kvlog.ttft_split(legs, [0.5], 120.0) is None
    assert kvlog.ttft_split([legs[0], {"prefill_s": 0.5, "decode_first_s": None}], [0.5, 0.8], 120.0) is None
