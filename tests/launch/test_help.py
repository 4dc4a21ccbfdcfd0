"""`launch/*.py --help` shows the config groups that entry point takes, once: the groups its
root composes (conf/<root>.yaml's defaults), not every folder of conf/ (conf/study/ holds
`fabricbench study`'s specs and is no group)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, child_env
from workloads.commands.entry import only_root_groups, root_groups

HYDRA_HELP = """launcher is powered by Hydra.

== Configuration groups ==
Compose your configuration from those groups (group=option)

fabric: ib, loopback
load: cpu_sweep
study: emu-ab, emu-pd
workload: collectives, pretrain
workload/init: checkpoint, scratch


== Config ==
fabric:
  name: loopback
study: null
"""


def test_only_the_groups_a_root_composes_are_listed_and_the_config_is_kept():
    kept = only_root_groups(HYDRA_HELP, {"fabric", "workload"})
    assert "load: cpu_sweep" not in kept.splitlines() and "study: emu-ab, emu-pd" not in kept.splitlines()
    assert "workload/init: checkpoint, scratch" in kept and "fabric: ib, loopback" in kept
    assert kept.endswith("== Config ==\nfabric:\n  name: loopback\nstudy: null\n")  # the config is not a group list


def test_each_root_names_its_own_groups():
    assert root_groups("config") >= {"fabric", "model", "parallel", "workload", "logger"}
    # inference is a workload of the same root, which brings the server and load groups in, and
    # offers neither the workload group (infer.py runs one) nor parallel (not applicable)
    assert root_groups("config", "inference") >= {"fabric", "model", "server", "load", "logger"}
    assert not root_groups("config", "inference") & {"workload", "parallel"}
    assert not root_groups("config") & {"server", "load"}
    assert not root_groups("config", "collectives") & {"workload", "parallel", "model", "server"}
    assert not (root_groups("config") | root_groups("config", "inference") | root_groups("serve")) & {"study", "hydra"}
    assert not root_groups("serve") & {"load", "workload", "parallel"}


@pytest.mark.parametrize("script, listed, not_listed", [
    ("train.py", ["fabric", "model", "parallel", "workload", "workload/init", "logger"], ["study", "load", "server"]),
    ("infer.py", ["fabric", "model", "server", "load", "logger"], ["study", "workload", "parallel"]),
])
def test_help_lists_the_entry_points_groups_once(script, listed, not_listed):
    """Started with plain python, a distributed entry point used to self-launch its ranks and
    each printed the help; now the help is this process's, printed once, and starts no rank."""
    r = subprocess.run([sys.executable, str(REPO / "launch" / script), "--help"], capture_output=True, text=True,
                       cwd=REPO, env=child_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("== Configuration groups ==") == 1, r.stdout
    groups = r.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    named = {line.split(":")[0] for line in groups.splitlines() if ": " in line and "group=option" not in line}
    assert named >= set(listed) and not named & set(not_listed), groups
