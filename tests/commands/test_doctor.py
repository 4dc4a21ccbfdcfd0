"""`fabricbench doctor`: the live host's honest inventory (no RDMA, lo, no GPU here) through
the installed console script, and profile checks against fixture sysfs trees."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FIXTURES, REPO
from workloads.commands import cli

SYSFS = FIXTURES / "sysfs"


@pytest.mark.slow
def test_live_host_inventory_via_console_script():
    exe = Path(sys.executable).parent / "fabricbench"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(exe), "doctor", "fabric=loopback"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "none (no /sys/class/infiniband: no RDMA devices on this host)" in text
    lo = next(line for line in text.splitlines() if line.strip().startswith("lo "))
    assert " up " in lo and "127.0.0.1" in lo
    assert "none found (no nvidia-smi or rocm-smi answered)" in text  # this machine has no GPU
    assert "Check fabric=loopback (gloo)" in text and "OK: everything the profile names is present and up" in text


def test_roce_fixture_check_table_and_json(capsys):
    assert cli.main(["doctor", "--sysfs-root", str(SYSFS / "roce_host"), "fabric=roce"]) == 0
    text = capsys.readouterr().out
    assert "mlx5_0:1     ACTIVE   Ethernet     100 Gb/sec (4X EDR)" in text
    assert "GID 3   RoCE v2     0000:0000:0000:0000:0000:ffff:0a00:0001  eth0" in text
    assert "OK: everything the profile names is present and up" in text
    rc = cli.main(["doctor", "--json", "--sysfs-root", str(SYSFS / "roce_host"), "fabric=roce",
                   "fabric.env.NCCL_IB_GID_INDEX=2"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["check"]["ready"] is False
    assert doc["check"]["problems"][0] == "NCCL_IB_GID_INDEX=2 on mlx5_0:1 is IB/RoCE v1, not RoCE v2; RoCE v2 GIDs there: 1, 3"
    assert [p["label"] for p in doc["inventory"]["rdma"]] == ["mlx5_0:1", "mlx5_1:1"]
    assert {i["name"]: i["up"] for i in doc["inventory"]["net"]} == {"eth0": True, "eth1": True, "lo": True}


def test_ib_host_port_down_and_no_rdma_host(capsys):
    assert cli.main(["doctor", "--sysfs-root", str(SYSFS / "ib_host"), "fabric=ib"]) == 1
    text = capsys.readouterr().out
    assert "mlx5_1:1     DOWN     InfiniBand" in text
    assert "FAIL: NCCL_IB_HCA=mlx5 selects mlx5_1:1, whose port state is DOWN" in text
    assert cli.main(["doctor", "--sysfs-root", str(SYSFS / "nordma_host"), "fabric=roce"]) == 1
    text = capsys.readouterr().out
    assert "FAIL: NCCL_IB_HCA=mlx5 matched no RDMA device; present: none" in text


def test_usage_errors(capsys):
    assert cli.main(["doctor", "--sysfs-root", "/nonexistent/sysfs"]) == 2
    assert "--sysfs-root /nonexistent/sysfs is not a directory" in capsys.readouterr().err
    assert cli.main(["doctor", "--sysfs-root", str(SYSFS / "nordma_host"), "fabric=nosuchfabric"]) == 2
    assert "nosuchfabric" in capsys.readouterr().err


def test_nccl_profile_without_a_gpu_is_not_ready():
    """doctor says whether a profile can run here: NCCL needs a GPU, and this machine may have none."""
    import torch

    from workloads.commands.doctor import check_profile

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    check = check_profile(["fabric=pcie"])
    assert not check["ready"] and any("needs a GPU" in p for p in check["problems"])
