"""Real 2-rank Gloo runs: the interface each rank bound is recorded, a label that disagrees
fails the run with one message, and the `lo` counters agree with the bytes DDP moved.
Plus the NIC counter formulas, pinned by hand-computed values."""

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest
import yaml

from helpers import FIXTURES, REPO
from workloads.fabric import nic
from workloads.fabric.profile import FabricProfile

SYSFS = FIXTURES / "sysfs"


def test_jain_index_hand_values():
    assert nic.jain_index([5, 5, 5, 5]) == 1.0
    assert nic.jain_index([8, 0, 0, 0]) == 0.25  # one rail of four carried everything: 1/n
    assert nic.jain_index([3, 1]) == pytest.approx(16 / 20)  # (3+1)^2 / (2 * (9+1))
    assert nic.jain_index([]) is None and nic.jain_index([0, 0]) is None


def test_summarize_hand_values():
    c = lambda a, b: {"net:eth0": (a, a), "rdma:mlx5_0:1": (b, 2 * b)}  # noqa: E731
    steps = [(0.0, c(0, 0), 0.5, c(1000, 4000)), (1.0, c(1000, 4000), 1.5, c(3000, 8000))]
    s = nic.summarize(steps, ["rdma:mlx5_0:1"])
    assert s["window_s"] == 1.0 and s["steps"] == 2
    assert s["per_step"] == {"rdma:mlx5_0:1": {"tx_bytes": [4000, 4000], "rx_bytes": [8000, 8000]}}
    r = s["per_rail"]["rdma:mlx5_0:1"]
    assert (r["tx_bytes"], r["rx_bytes"], r["tx_gbit_per_s"]) == (8000, 16000, 8000 * 8 / 1.0 / 1e9)
    assert s["per_rail"]["net:eth0"]["tx_bytes"] == 3000  # traffic off the profile's rails stays visible
    assert s["jain_index"] == 1.0
    # a counter that went backwards (reset, or an old 32-bit counter) is unknown, not negative
    back = nic.summarize([(0.0, c(10, 0), 1.0, c(5, 0))], ["net:eth0"])
    assert back["per_step"]["net:eth0"]["tx_bytes"] == [None]


def test_read_counters_fixture_and_rails():
    c = nic.read_counters(SYSFS / "roce_host")
    assert c["rdma:mlx5_0:1"] == (4000, 8000)  # port_xmit_data 1000 words x 4 bytes
    assert c["rdma:mlx5_1:1"] == (8000, 16000) and c["net:eth0"] == (5000, 6000)
    prof = FabricProfile.from_config(yaml.safe_load((REPO / "conf" / "fabric" / "roce.yaml").read_text()))
    assert nic.rails_for(prof, {"NCCL_IB_HCA": "mlx5"}, None, SYSFS / "roce_host") == ["rdma:mlx5_0:1", "rdma:mlx5_1:1"]
    nccl_seen = {"summary": {"devices": [{"name": "mlx5_1", "port": 1, "link_layer": "RoCE"}]}}
    assert nic.rails_for(prof, {}, nccl_seen, SYSFS / "roce_host") == ["rdma:mlx5_1:1"]  # what NCCL used wins


def _launch(tmp: Path, run_id: str, *extra: str) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    args = [sys.executable, str(REPO / "launch" / "train.py"), "fabric=loopback", f"output_root={tmp}",
            f"run_id={run_id}", "train.steps=8", "train.warmup_steps=2", *extra]
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _grad_bytes() -> int:
    from workloads.models.neox import GPTNeoX, NeoXConfig

    cfg = yaml.safe_load((REPO / "conf" / "model" / "neox-tiny.yaml").read_text())
    model = GPTNeoX(NeoXConfig.from_dict(cfg))
    return 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)  # fp32 gradients


@pytest.mark.slow
def test_two_rank_gloo_binding_counters_and_mismatch(tmp_path):
    # Both runs at once (4 processes on 2 cores) to keep wall time down.
    ok = _launch(tmp_path, "ok")
    bad = _launch(tmp_path, "bad", "fabric.expect.interfaces=[eth0]")
    out_ok, err_ok = ok.communicate(timeout=400)
    out_bad, err_bad = bad.communicate(timeout=400)
    assert ok.returncode == 0, err_ok[-3000:]

    (rec_path,) = (tmp_path / "ok" / "records").glob("*.json")
    rec = json.loads(rec_path.read_text())
    t = rec["fabric"]["transport"]
    assert t["verdict"] == "ok" and t["summary"]["interfaces"] == ["lo"]
    for r, b in enumerate(t["summary"]["ranks"]):
        # each rank's Gloo pair socket runs over lo; its address is loopback's
        assert b["rank"] == r and b["interfaces"] == ["lo"] and b["peer_connections"] >= 1
        assert set(b["addresses"]) <= {"127.0.0.1", "::1"} and b["listen"]

    # lo counters vs what DDP moved. 2 ranks: any bandwidth-optimal all_reduce (Gloo's ring)
    # sends 2(n-1)/n x S = S bytes per rank, so lo's tx (and rx) grows by 2 S per step, S the
    # fp32 gradient bytes. Headers add ~0.1% (64 KiB segments on lo); other processes on this
    # host (other tests!) only add. Bound: the median step within [1.0, 1.10] x 2 S, and no
    # step below 2 S.
    expected = 2 * _grad_bytes()
    n = rec["nic"]
    assert n["rails"] == ["net:lo"] and n["steps"] == 6 and n["jain_index"] == 1.0
    tx, rx = n["per_step"]["net:lo"]["tx_bytes"], n["per_step"]["net:lo"]["rx_bytes"]
    # loopback: every byte sent is received on the same interface, and the kernel counts both
    # at once; the host read is one snapshot of /proc/net/dev (workloads/fabric/nic.py), so
    # they agree (read as two sysfs files they once differed by 861 KB of other jobs' traffic).
    assert all(abs(a - b) <= 4096 for a, b in zip(tx, rx)), (tx, rx)
    assert min(tx) >= expected, (tx, expected)
    assert median(tx) <= 1.10 * expected, (tx, expected)
    assert n["per_rail"]["net:lo"]["tx_gbit_per_s"] > 0

    # the label says eth0, the ranks bound lo: exit 3, one message, the record keeps it
    assert bad.returncode == 3, err_bad[-3000:]
    assert "error: fabric=loopback but ranks 0, 1 bound lo, not eth0 (fabric.verify=warn records it and goes on)" in err_bad
    assert "Traceback" not in err_bad
    (bad_path,) = (tmp_path / "bad" / "records").glob("*.json")
    bad_rec = json.loads(bad_path.read_text())
    assert bad_rec["status"] == "failed" and bad_rec["error"].startswith("fabric=loopback but ranks 0, 1 bound lo")
