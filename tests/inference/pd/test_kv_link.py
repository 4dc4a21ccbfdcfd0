"""server=vllm-pd on two real nodes: the NIC cross-check of the KV bytes (record.kv.link) on the
rails of node 0 that the fabric profile names, and the RDMA and socket profiles' KV-path
expectations. This host has no RDMA device, so the ConnectX ports are a fake sysfs tree
(tests/fixtures/sysfs/roce_host, read through FABRICBENCH_SYSFS_ROOT as on a real host) and the
KV path is UCX's own log format (tests/fixtures/ucx_logs, which cite UCX's source); the observer,
the profile files and the counters' arithmetic are the product's own. The real two-node job with
real vLLM is tests/inference/pd/test_slurm_pd.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from helpers import FIXTURES, REPO
from workloads.fabric.profile import FabricProfile
from workloads.fabric.verify_kv import kv_verdict
from workloads.inference.adapters import vllm_pd
from workloads.inference.adapters.base import ServerSpec
from workloads.inference.loadgen.client import RequestResult
from workloads.inference.pd import kvlog

UCX = FIXTURES / "ucx_logs"
# one interval of two 0.125 MiB transfers (vLLM 0.32's line: tests/fixtures/vllm_kv)
METRICS = ("(APIServer pid=7) INFO 11-28 04:00:00 [metrics.py:103] KV Transfer metrics: Num successful transfers=2, "
           "Avg xfer time (ms)=0.2, P90 xfer time (ms)=0.3, Avg post time (ms)=0.1, P90 post time (ms)=0.1, "
           "Avg MB per transfer=0.125, Throughput (MB/s)=625.0, Avg number of descriptors=2.0, Num failed transfers=0, "
           "Num KV expired reqs=0, Num notifs after expiry=0\n")
KV_BYTES = 2 * 128 * 1024  # two 24-token prompts, one 128-token block of llama-tiny's 1 KiB a token each
TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128,
        "torch_dtype": "float32"}


def _profile(name: str) -> FabricProfile:
    return FabricProfile.from_config(yaml.safe_load((REPO / "conf" / "fabric" / f"{name}.yaml").read_text()))


def test_ucx_net_devices_as_rails():
    assert kvlog.ucx_rails("mlx5_0:1, eth0") == ["rdma:mlx5_0:1", "net:eth0"]
    assert kvlog.ucx_rails("lo") == ["net:lo"]
    for none in (None, "", "all", "^eth0"):  # no device of its own: the profile's interfaces decide
        assert kvlog.ucx_rails(none) == []


@pytest.mark.parametrize("profile,log,verdict", [
    ("roce", "ucx_rdma_inter_node.log", "ok"),
    ("ib", "ucx_rdma_inter_node.log", "ok"),
    ("roce", "ucx_1.23_tcp_only.log", "mismatch"),    # a silent fallback to UCX's tcp
    ("ib", "ucx_1.23_tcp_only.log", "mismatch"),
    ("socket", "ucx_1.23_tcp_only.log", "ok"),
    ("socket", "ucx_rdma_inter_node.log", "mismatch"),  # RDMA under a TCP label
    # P and D on one GPU node: the KV cache stays inside it (cma here; cuda_ipc between GPUs)
    ("intranode", "ucx_1.23_cma_loopback.log", "ok"),
    ("intranode", "ucx_1.23_tcp_only.log", "mismatch"),
    ("pcie", "ucx_rdma_inter_node.log", "mismatch"),
])
def test_the_fabric_profiles_say_which_transports_may_carry_the_kv_cache(profile, log, verdict):
    v = kv_verdict(_profile(profile), (UCX / log).read_text())
    assert v["verdict"] == verdict, v
    if verdict == "mismatch":
        assert "which this fabric forbids" in v["message"], v["message"]


class Node0:
    """Node 0 of a two-node vllm-pd job: the observer (as launch/infer.py makes it), its run
    directory with the instances' logs, and a copy of a ConnectX host's sysfs whose port
    counters the test advances as the KV cache would."""

    def __init__(self, tmp: Path, monkeypatch, ucx_log: str, tp: int = 1, **server_env):
        monkeypatch.delenv("FABRICBENCH_EMULATED_NODES", raising=False)
        monkeypatch.setattr(vllm_pd, "SETTLE_S", 0)
        tmp.mkdir(exist_ok=True)
        self.sysfs = tmp / "sysfs"
        shutil.copytree(FIXTURES / "sysfs" / "roce_host", self.sysfs)
        monkeypatch.setenv("FABRICBENCH_SYSFS_ROOT", str(self.sysfs))
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text(json.dumps(TINY))
        spec = ServerSpec(adapter="vllm_pd", host="10.0.0.1", port=18000, nnodes=2, node_rank=0, tp=tp,
                          dist_init_addr="10.0.0.1:29500", run_dir=str(tmp), env=server_env,
                          extra_args=("--dtype", "float32"), options={"decode_host": "10.0.0.2"})
        self.obs = vllm_pd.observer(spec, {"name": "llama-tiny", "path": str(tmp / "model")})
        (tmp / "server").mkdir()
        for role, p in self.obs.logs.items():
            p.write_text((UCX / ucx_log).read_text() if role == "decode" else "")

    def port(self, dev: str, words: int) -> None:
        p = self.sysfs / "class" / "infiniband" / dev / "ports" / "1" / "counters" / "port_xmit_data"
        p.write_text(str(int(p.read_text()) + words))

    def point(self, sent: dict[str, int], metrics: str = METRICS, done: list | None = None) -> dict:
        """One point of two completed requests (or `done`), with `sent` 4-byte words leaving each port."""
        mark = self.obs.begin()
        for dev, words in sent.items():
            self.port(dev, words)
        with open(self.obs.stats_log, "a") as f:
            f.write(metrics)
        done = done or [RequestResult(ok=True, prompt_len=24, ttft=0.01) for _ in range(2)]
        return self.obs.end(mark, done, [])["kv"]


def test_the_kv_bytes_crossed_node_0s_rdma_ports(tmp_path, monkeypatch, capsys):
    node = Node0(tmp_path, monkeypatch, "ucx_rdma_inter_node.log")
    verdict = node.obs.verify(_profile("roce"))["kv_path"]
    assert verdict["verdict"] == "ok" and verdict["summary"]["kv_transports"] == ["rc_mlx5"], verdict
    # NCCL_IB_HCA=mlx5 (roce.yaml) selects both active ConnectX ports; UCX split the reads over both
    assert node.obs.rails == ["rdma:mlx5_0:1", "rdma:mlx5_1:1"]
    # 262144 B of KV cache + 5% of IB headers, half on each port: port_xmit_data counts 4-byte words
    kv = node.point({"mlx5_0": 34406, "mlx5_1": 34406})
    assert kv["bytes_per_transfer"] == 131072 and kv["matches_model"] is True
    link = kv["link"]
    assert (link["interface"], link["tx_bytes"], link["kv_bytes"]) == ("rdma:mlx5_0:1,rdma:mlx5_1:1", 4 * 68812,
                                                                       KV_BYTES)
    assert link["verdict"] == "ok" and link["ratio"] == pytest.approx(275248 / 262144) and "rate" not in link
    assert "warning" not in capsys.readouterr().out


def test_each_tp_worker_logs_its_own_shard_of_the_kv_cache(tmp_path, monkeypatch):
    """TP=2 on both instances: each worker reads its own KV head (llama-tiny has 2) and vLLM
    logs one transfer per worker, "averaged over all individual rank-level transfers" (vLLM's
    nixl stats.py): two requests are four transfers of half the KV cache each."""
    node = Node0(tmp_path, monkeypatch, "ucx_rdma_inter_node.log", tp=2)
    node.obs.verify(_profile("roce"))
    shards = METRICS.replace("Num successful transfers=2", "Num successful transfers=4").replace(
        "Avg MB per transfer=0.125", "Avg MB per transfer=0.0625")
    kv = node.point({"mlx5_0": 34406, "mlx5_1": 34406}, shards)
    assert (kv["tp"], kv["kv_heads_per_rank"], kv["transfers"], kv["requests"]) == (2, 1, 4, 2)
    assert kv["bytes_per_transfer"] == kv["expected_bytes_per_transfer"] == 65536 and kv["matches_model"] is True
    assert kv["link"]["kv_bytes"] == KV_BYTES  # the link still carries every head of every prompt
    # more workers than KV heads: each holds one replicated head
    shape = kvlog.KVShape.from_hf_config(TINY)
    assert shape.transfer_bytes(24, 128, tp=8) == shape.transfer_bytes(24, 128) // 2


def test_the_kv_size_follows_the_servers_prompt_tokens(tmp_path, monkeypatch):
    """vLLM adds BOS to a text prompt (CompletionRequest.add_special_tokens defaults to true): a
    prompt the client counted as 128 tokens is 129 on the server, two 128-token blocks, not one.
    The server's usage.prompt_tokens is what the KV cache holds."""
    node = Node0(tmp_path, monkeypatch, "ucx_rdma_inter_node.log")
    node.obs.verify(_profile("roce"))
    two_blocks = METRICS.replace("Avg MB per transfer=0.125", "Avg MB per transfer=0.25")
    done = [RequestResult(ok=True, prompt_len=128, ttft=0.01, server_prompt_tokens=129) for _ in range(2)]
    kv = node.point({"mlx5_0": 2 * 34406, "mlx5_1": 2 * 34406}, two_blocks, done)
    assert kv["expected_bytes_per_transfer"] == 2 * 131072 and kv["matches_model"] is True
    assert kv["prompts_counted_by_server"] == 2 and kv["link"]["kv_bytes"] == 2 * KV_BYTES
    # a server that does not say (no usage): the client's count
    kv = node.point({"mlx5_0": 34406, "mlx5_1": 34406})
    assert kv["prompts_counted_by_server"] == 0 and kv["expected_bytes_per_transfer"] == 131072


def test_kv_bytes_that_missed_the_profiles_ports_are_said(tmp_path, monkeypatch, capsys):
    """UCX limited to mlx5_1 (server.env), and the bytes left by mlx5_0: the ports the run names
    did not carry the KV cache, and the record says so, without failing the point."""
    node = Node0(tmp_path, monkeypatch, "ucx_rdma_inter_node.log", UCX_NET_DEVICES="mlx5_1:1")
    node.obs.verify(_profile("roce"))
    assert node.obs.rails == ["rdma:mlx5_1:1"]
    link = node.point({"mlx5_0": 70000, "mlx5_1": 10})["link"]
    assert (link["interface"], link["tx_bytes"], link["verdict"]) == ("rdma:mlx5_1:1", 40, "not_crossed")
    assert link["message"] == ("rdma:mlx5_1:1 carried 40 B from the prefill node, far below the 262144 B of KV cache "
                               "its requests moved: the KV cache did not cross node 0's rdma:mlx5_1:1 (another "
                               "interface carried it: fabric.kv_path names UCX's devices)")
    assert f"warning: {link['message']}" in capsys.readouterr().out


def test_one_host_and_no_named_interface_are_unverified_with_the_reason(tmp_path, monkeypatch):
    # both "nodes" on one host (the one-machine Slurm): UCX's intra-node protocols, no NIC in the path
    node = Node0(tmp_path / "a", monkeypatch, "ucx_1.23_cma_loopback.log")
    node.obs.verify(_profile("loopback"))
    link = node.point({})["link"]
    assert link["verdict"] == "unverified" and "both nodes are this host, so no NIC carried it" in link["message"]
    # a profile that names no interface: nothing to read, and the record says which variables would name one
    node = Node0(tmp_path / "b", monkeypatch, "ucx_rdma_inter_node.log")
    node.obs.verify(FabricProfile.from_config({"name": "bare", "backend": "nccl", "env": {}}))
    link = node.point({"mlx5_0": 70000})["link"]
    assert (link["verdict"], link["interface"]) == ("unverified", None)
    assert link["message"].startswith("the fabric profile names no interface for the KV path (UCX_NET_DEVICES")
