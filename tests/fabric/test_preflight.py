"""Preflight against fixture sysfs trees (tests/fixtures/sysfs/): a RoCE host with v1 and v2
GIDs, an IB host with one port down, a host without RDMA; and the live host (lo)."""


import os

import pytest
import yaml

from helpers import FIXTURES, REPO
from workloads.core.errors import UsageError
from workloads.fabric import preflight
from workloads.fabric.preflight import NameList
from workloads.fabric.profile import FabricProfile

SYSFS = FIXTURES / "sysfs"
CONF = REPO / "conf" / "fabric"


def profile(name: str, **env) -> FabricProfile:
    cfg = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    cfg["env"] = cfg.get("env", {}) | env
    return FabricProfile.from_config(cfg)


def test_nccl_list_syntax():
    prefix, exact = NameList.parse("mlx5"), NameList.parse("=mlx5_1")
    assert prefix.matches("mlx5_0") and prefix.matches("mlx5_10") and not prefix.matches("bnxt_re0")
    assert exact.matches("mlx5_1") and not exact.matches("mlx5_10")
    ex = NameList.parse("^mlx5_1")  # excludes mlx5_1 and (prefix) mlx5_10
    assert ex.matches("mlx5_0") and not ex.matches("mlx5_1") and not ex.matches("mlx5_10")
    ex_exact = NameList.parse("^=mlx5_1")
    assert ex_exact.matches("mlx5_10") and not ex_exact.matches("mlx5_1")
    ports = NameList.parse("mlx5_0:1,mlx5_1:2")
    assert ports.matches("mlx5_0", 1) and not ports.matches("mlx5_0", 2) and ports.matches("mlx5_1", 2)
    with pytest.raises(UsageError, match="port 'x'"):
        NameList.parse("mlx5_0:x")


def test_roce_host_inventory():
    ports = preflight.rdma_ports(SYSFS / "roce_host")
    assert [p.label for p in ports] == ["mlx5_0:1", "mlx5_1:1"]
    p = ports[0]
    assert (p.state, p.link_layer, p.nccl_link_layer, p.rate) == ("ACTIVE", "Ethernet", "RoCE", "100 Gb/sec (4X EDR)")
    assert [(g.index, g.type, g.is_roce_v2) for g in p.gids] == \
        [(0, "IB/RoCE v1", False), (1, "RoCE v2", True), (2, "IB/RoCE v1", False), (3, "RoCE v2", True)]  # slot 4 unused
    assert p.gid(3).ndev == "eth0"


def test_roce_host_gid_checks():
    root = SYSFS / "roce_host"
    assert preflight.check(profile("roce"), environ={}, root=root) == []  # GID 3 = RoCE v2, eth0 up
    (v1,) = preflight.check(profile("roce", NCCL_IB_HCA="=mlx5_0", NCCL_IB_GID_INDEX="2"), environ={}, root=root)
    assert v1 == "NCCL_IB_GID_INDEX=2 on mlx5_0:1 is IB/RoCE v1, not RoCE v2; RoCE v2 GIDs there: 1, 3"
    (gone,) = preflight.check(profile("roce", NCCL_IB_HCA="mlx5_1:1", NCCL_IB_GID_INDEX="7"), environ={}, root=root)
    assert gone.startswith("NCCL_IB_GID_INDEX=7 does not exist on mlx5_1:1 (GIDs: 0=IB/RoCE v1, 1=RoCE v2")
    (hca,) = preflight.check(profile("roce", NCCL_IB_HCA="mlx5_9"), environ={}, root=root)
    assert hca == "NCCL_IB_HCA=mlx5_9 matched no RDMA device; present: mlx5_0:1 (RoCE, ACTIVE), mlx5_1:1 (RoCE, ACTIVE)"
    # RoCE ports under the ib label
    probs = preflight.check(profile("ib", NCCL_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0"), environ={}, root=root)
    assert len(probs) == 2 and "mlx5_0:1, whose link layer is Ethernet; fabric=ib expects InfiniBand" in probs[0]


def test_ib_host_port_down():
    root = SYSFS / "ib_host"
    probs = preflight.check(profile("ib"), environ={}, root=root)
    assert probs == ["NCCL_IB_HCA=mlx5 selects mlx5_1:1, whose port state is DOWN (not ACTIVE); bring the link up "
                     "or leave it out of NCCL_IB_HCA (e.g. NCCL_IB_HCA=^=mlx5_1)"]
    assert preflight.check(profile("ib", NCCL_IB_HCA="^=mlx5_1"), environ={}, root=root) == []
    assert preflight.check(profile("ib", NCCL_IB_HCA="=mlx5_0"), environ={}, root=root) == []
    (down,) = preflight.check(profile("ib", NCCL_IB_HCA="=mlx5_0", GLOO_SOCKET_IFNAME="ib1"), environ={}, root=root)
    assert down == "GLOO_SOCKET_IFNAME=ib1 selects ib1, which is down; present: ib0 (up), ib1 (down), lo (up)"


def test_host_without_rdma():
    root = SYSFS / "nordma_host"
    with pytest.raises(UsageError) as e:
        preflight.preflight(profile("roce"), environ={}, root=root)
    msg = str(e.value)
    assert msg.startswith("fabric=roce cannot run on this host")
    assert "NCCL_IB_HCA=mlx5 matched no RDMA device; present: none (no /sys/class/infiniband" in msg
    # sockets are fine here; a wrong interface name lists what is there
    assert preflight.check(profile("socket"), environ={}, root=root) == []
    (bad,) = preflight.check(profile("socket", NCCL_SOCKET_IFNAME="eth9", GLOO_SOCKET_IFNAME=None), environ={}, root=root)
    assert bad == "NCCL_SOCKET_IFNAME=eth9 matched no network interface; present: docker0 (down), eth0 (up), lo (up)"
    # NCCL-style exclusion is fine for NCCL; Gloo takes plain names
    assert preflight.check(profile("socket", NCCL_SOCKET_IFNAME="^docker,lo", GLOO_SOCKET_IFNAME=None),
                           environ={}, root=root) == []
    (gloo,) = preflight.check(profile("loopback", GLOO_SOCKET_IFNAME="^docker"), environ={}, root=root)
    assert "Gloo takes exact interface names" in gloo


def test_user_environment_and_profile_unset():
    # the profile's value wins over the user's; a None in the profile unsets the user's
    env = preflight.effective_env({"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_NTHREADS": None},
                                  {"NCCL_IB_HCA": "mlx5_9", "NCCL_SOCKET_NTHREADS": "4", "PATH": "/bin"})
    assert env == {"NCCL_IB_HCA": "mlx5_0", "PATH": "/bin"}


def test_live_host_loopback_passes_and_bad_iface_fails():
    preflight.preflight(profile("loopback"), environ={})  # lo exists and is up on every Linux host
    with pytest.raises(UsageError, match="GLOO_SOCKET_IFNAME=nope0 matched no network interface; present: .*lo \\(up\\)"):
        preflight.preflight(profile("loopback", GLOO_SOCKET_IFNAME="nope0"), environ={})


def test_memlock_warning():
    import resource

    from workloads.fabric.preflight import memlock_warning

    assert "ulimit -l unlimited" in memlock_warning(64 * 1024, True)
    assert memlock_warning(64 * 1024, False) is None  # Socket / PCIe fabrics pin nothing
    assert memlock_warning(resource.RLIM_INFINITY, True) is None and memlock_warning(2 << 30, True) is None


def test_nccl_fabric_on_an_old_driver_names_the_driver(tmp_path, monkeypatch):
    """Review #9/gpu-check risk 1: every workload's backend check, not only gpu-check."""
    import torch

    from workloads.core.errors import UsageError

    if torch.cuda.is_available() or not (torch.version.cuda or "").startswith("13"):
        pytest.skip("needs this lock's CUDA 13 torch on a machine where it sees no GPU")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 550.163.01\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(UsageError, match=r"torch sees no GPU: the NVIDIA driver is 550.163.01, older than the R580"):
        profile("intranode").check_backend_usable()
