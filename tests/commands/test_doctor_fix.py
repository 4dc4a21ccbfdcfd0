"""doctor prints the site settings a node suggests for a profile, and they make it pass; doctor
--compare diffs nodes. On tests/fixtures/sysfs/dual_host, a node holding both fabrics, and its
routing table (dual_host_proc)."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml

import workloads
from helpers import FIXTURES, REPO, child_env
from workloads.commands import doctor
from workloads.fabric import sitefix

DUAL = FIXTURES / "sysfs" / "dual_host"
PROC = FIXTURES / "sysfs" / "dual_host_proc"
DOCTOR = [sys.executable, "-m", "workloads.commands.cli", "doctor"]


def pasted(stdout: str) -> tuple[str, dict]:
    """(the file doctor names, the YAML it prints) from doctor's output."""
    lines = stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("Suggested site settings, from this node (paste into "))
    return lines[at].split("paste into ")[1].rstrip("):"), yaml.safe_load("\n".join(lines[at + 1:]))


@pytest.fixture
def site_conf(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    for f in (conf / "local").glob("*.yaml"):
        f.unlink()
    monkeypatch.setattr(workloads, "CONF_DIR", str(conf))
    return conf


@pytest.mark.parametrize("fabric,hca", [("roce", "=mlx5_2,mlx5_3"), ("ib", "=mlx5_0,mlx5_1")])
def test_doctor_prints_the_fix_and_pasted_it_passes(fabric, hca, site_conf):
    r = subprocess.run([*DOCTOR, f"fabric={fabric}", "--sysfs-root", str(DUAL), "--proc-root", str(PROC)], cwd=REPO,
                       env=child_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "  FAIL: NCCL_IB_HCA=mlx5 selects " in r.stdout, r.stdout + r.stderr
    path, settings = pasted(r.stdout)
    assert path == f"conf/local/{fabric}.yaml"
    env = settings["env"]
    assert env["NCCL_IB_HCA"] == hca  # the active ports of the profile's link layer only
    assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("=eno1", "eno1")  # the default route, metric 100
    assert env.get("NCCL_IB_GID_INDEX") == ("3" if fabric == "roce" else None)  # v2 and IPv4 on both ports
    if fabric == "roce":
        assert "# RoCE v2 GIDs: mlx5_2:1 1, 3; mlx5_3:1 1, 3" in r.stdout
        assert "# mlx5_2:1 congestion counters: np_cnp_sent 120, rp_cnp_handled 95, np_ecn_marked_roce_packets 130" \
            in r.stdout and "ethtool -S ens1f0np0 | grep pause" in r.stdout
        assert "# NUMA node per HCA: mlx5_2 0, mlx5_3 1" in r.stdout
    else:
        assert "# left out: mlx5_4:1 (not ACTIVE)" in r.stdout
    # pasted into the site file, the same check passes
    (site_conf / "local" / f"{fabric}.yaml").write_text(yaml.safe_dump(settings))
    check = doctor.check_profile([f"fabric={fabric}"], root=str(DUAL))
    assert check["ready"] and check["problems"] == [] and check["env"]["NCCL_IB_HCA"] == hca


def test_gid_and_route_choices():
    assert sitefix.default_route_iface(PROC) == "eno1"  # two default routes: the lower metric
    assert sitefix.default_route_iface(FIXTURES / "none") is None
    roce = doctor.load_profile(["fabric=roce"])
    got = sitefix.suggest(roce, root=FIXTURES / "sysfs" / "roce_host", proc=FIXTURES / "none")
    assert got.env == {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"}  # 1 and 3 are v2; 3 is IPv4
    assert any(n.startswith("bootstrap: no default route in ") for n in got.notes)
    assert sitefix.suggest(doctor.load_profile(["fabric=loopback"]), root=DUAL, proc=PROC).env == \
        {"GLOO_SOCKET_IFNAME": "eno1"}


def test_compare_names_what_differs_between_nodes(tmp_path):
    a = tmp_path / "a"
    shutil.copytree(DUAL, a)
    b = tmp_path / "b"
    shutil.copytree(DUAL, b)
    port = b / "class" / "infiniband" / "mlx5_3" / "ports" / "1"
    (b / "class" / "infiniband" / "mlx5_2" / "fw_ver").write_text("28.36.1010\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    for d in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / d / "3").unlink()  # no IPv4 address on that port: its v2 GID 3 is gone
    files = []
    for name, root in (("a", a), ("b", b)):
        inv = doctor.inventory(str(root)) | {"host": f"node-{name}"}
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps({"inventory": inv, "check": None}))
    r = subprocess.run([*DOCTOR, "--compare", *map(str, files)], cwd=REPO, env=child_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "Compared 2 nodes: node-a, node-b",
        "  DIFFERS: mlx5_2 firmware: node-a 28.39.1002; node-b 28.36.1010",
        "  DIFFERS: mlx5_3:1 port: node-a ACTIVE Ethernet 400 Gb/sec (4X NDR); node-b ACTIVE Ethernet 200 Gb/sec (4X HDR)",
        "  DIFFERS: mlx5_3:1 RoCE v2 GIDs: node-a 1, 3; node-b 1"]
    assert sitefix.compare({"x": json.loads(files[0].read_text())["inventory"],
                            "y": json.loads(files[0].read_text())["inventory"]}) == []
    (tmp_path / "bad.json").write_text("not json")
    r = subprocess.run([*DOCTOR, "--compare", str(files[0]), str(tmp_path / "bad.json")], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(f"error: --compare {tmp_path / 'bad.json'}: not the output of")
    assert "Traceback" not in r.stderr
