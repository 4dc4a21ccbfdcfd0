"""Site settings per fabric (conf/local/<fabric>.yaml, merged over that profile only, recorded in
the fingerprint as `site`) and the one rule for exported variables: the profile wins, with a line
per variable it overwrote (docs/fabrics.md)."""

import shutil
import subprocess
import sys

import pytest

from helpers import REPO, child_env
from workloads.core.config import compose
from workloads.core.fingerprint import site_settings
from workloads.core.records import with_site
from workloads.fabric.profile import FabricProfile


@pytest.fixture
def conf(tmp_path):
    """A copy of the config tree whose conf/local holds a site file for ib and one for roce."""
    root = tmp_path / "conf"
    shutil.copytree(REPO / "conf", root, ignore=shutil.ignore_patterns("*.yaml~"))
    for f in (root / "local").glob("*.yaml"):
        f.unlink()  # this checkout's own site settings are not the test's
    (root / "local" / "ib.yaml").write_text('env:\n  NCCL_IB_HCA: "=mlx5_0,mlx5_1"\n  NCCL_SOCKET_IFNAME: ibp1\n')
    (root / "local" / "roce.yaml").write_text('env:\n  NCCL_IB_HCA: "=mlx5_8"\n  NCCL_IB_GID_INDEX: "5"\n')
    return root


def test_site_file_merges_over_its_own_profile_only(conf):
    ib = compose(str(conf), ["fabric=ib"]).fabric.env
    roce = compose(str(conf), ["fabric=roce"]).fabric.env
    sock = compose(str(conf), ["fabric=socket"]).fabric.env
    assert (ib.NCCL_IB_HCA, ib.NCCL_SOCKET_IFNAME, ib.GLOO_SOCKET_IFNAME) == ("=mlx5_0,mlx5_1", "ibp1", "ib0")
    assert (roce.NCCL_IB_HCA, roce.NCCL_IB_GID_INDEX, roce.NCCL_SOCKET_IFNAME) == ("=mlx5_8", "5", "eth0")
    assert "NCCL_IB_HCA" not in sock or sock.NCCL_IB_HCA != "=mlx5_0,mlx5_1"
    # the command line still wins over the site file
    assert compose(str(conf), ["fabric=ib", 'fabric.env.NCCL_IB_HCA="=mlx5_3"']).fabric.env.NCCL_IB_HCA == "=mlx5_3"
    # a default.yaml over every profile, and the fabric's own file over it
    (conf / "local" / "default.yaml").write_text("# @package _global_\nfabric:\n  env:\n    NCCL_SOCKET_IFNAME: bond0\n")
    assert compose(str(conf), ["fabric=roce"]).fabric.env.NCCL_SOCKET_IFNAME == "bond0"
    assert compose(str(conf), ["fabric=ib"]).fabric.env.NCCL_SOCKET_IFNAME == "ibp1"


def test_site_settings_in_the_fingerprint_not_the_dirty_tree(conf):
    local = conf / "local"
    got = site_settings("ib", local)
    assert list(got) == ["conf/local/ib.yaml"] and len(got["conf/local/ib.yaml"]) == 16
    (local / "default.yaml").write_text("# @package _global_\n")
    assert list(site_settings("roce", local)) == ["conf/local/default.yaml", "conf/local/roce.yaml"]
    before = site_settings("roce", local)["conf/local/roce.yaml"]
    (local / "roce.yaml").write_text('env:\n  NCCL_IB_GID_INDEX: "3"\n')
    assert site_settings("roce", local)["conf/local/roce.yaml"] != before  # another setting, another hash
    assert site_settings("pcie", local) == {"conf/local/default.yaml": site_settings("x", local)["conf/local/default.yaml"]}
    assert site_settings("../etc/passwd", local) == site_settings(None, local)
    (local / "default.yaml").unlink()
    assert site_settings("socket", local) is None
    # the record keeps the fingerprint it had when this checkout has no site file for its fabric
    fp = {"git": {"commit": "abc", "dirty": False, "dirty_hash": None}}
    assert with_site(fp, {"fabric": {"name": "no-such-fabric"}}) == fp


def test_exported_variable_loses_with_a_line_each():
    roce = FabricProfile.from_config({"name": "roce", "backend": "nccl", "env": {
        "NCCL_IB_HCA": "=mlx5_8", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_QPS_PER_CONNECTION": None}})
    environ = {"NCCL_IB_HCA": "=mlx5_0,mlx5_9", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_QPS_PER_CONNECTION": "8",
               "NCCL_IB_SL": "1"}
    said = []
    applied = roce.apply(None, environ, say=said.append)
    assert said == [
        "fabric=roce: exported NCCL_IB_HCA==mlx5_0,mlx5_9 is overwritten: the profile sets =mlx5_8 (the profile "
        "wins; put it in conf/local/roce.yaml or pass fabric.env.NCCL_IB_HCA=...)",
        "fabric=roce: exported NCCL_IB_QPS_PER_CONNECTION=8 is overwritten: the profile unsets it (the profile "
        "wins; put it in conf/local/roce.yaml or pass fabric.env.NCCL_IB_QPS_PER_CONNECTION=...)"]
    assert environ["NCCL_IB_HCA"] == "=mlx5_8" and "NCCL_IB_QPS_PER_CONNECTION" not in environ
    assert applied == {"NCCL_IB_HCA": "=mlx5_8", "NCCL_IB_GID_INDEX": "3"}
    assert environ["NCCL_IB_SL"] == "1"  # what the profile does not name passes through, unsaid
    said.clear()
    roce.apply(None, environ, say=said.append)
    assert said == []  # equal values (a rank re-applying its launcher's profile) say nothing


def test_exported_variable_loses_on_a_node_started_by_exec():
    """A real process: nodes > 0 of a served job start under the profile this way; the exported
    value loses there too, and says so once."""
    env = child_env(GLOO_SOCKET_IFNAME="eth9", NCCL_DEBUG_SUBSYS="INIT")
    p = subprocess.run([sys.executable, "-m", "workloads.fabric.profile", "exec", "fabric=loopback", "--", "env"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "GLOO_SOCKET_IFNAME=lo" in p.stdout.splitlines()
    lines = [x for x in p.stderr.splitlines() if "overwritten" in x]
    assert lines == ["warning: fabric=loopback: exported GLOO_SOCKET_IFNAME=eth9 is overwritten: the profile sets lo "
                     "(the profile wins; put it in conf/local/loopback.yaml or pass fabric.env.GLOO_SOCKET_IFNAME=...)"]


def test_exported_variable_the_profile_does_not_name_wins_unsaid():
    """The other side of the rule, in a real process: an export the profile leaves alone (a site's
    NCCL_IB_SL, a debug subsystem) reaches the job as exported, with no line."""
    env = child_env(NCCL_IB_SL="1", NCCL_DEBUG_SUBSYS="INIT,NET")
    p = subprocess.run([sys.executable, "-m", "workloads.fabric.profile", "exec", "fabric=loopback", "--", "env"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert {"NCCL_IB_SL=1", "NCCL_DEBUG_SUBSYS=INIT,NET"} <= set(p.stdout.splitlines())
    assert "overwritten" not in p.stderr
