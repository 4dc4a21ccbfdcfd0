"""fabricbench on a real (private, one-machine) Slurm: munged + slurmctld + two slurmd.

The batch file runs one torchrun agent per Slurm node with c10d rendezvous on the first
node; a Hydra hydra/launcher=slurm sweep submits one job per point whose Slurm tasks are the
ranks. Both write real result records. Afterwards none of our daemons or job processes
may remain.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, child_env, records_in
from helpers.slurm_cluster import SlurmCluster, our_leftover_pids

pytestmark = pytest.mark.requires("root", "slurm")
TRAIN = ["fabric=loopback", "train.micro_batch_size=2", "train.steps=4", "train.warmup_steps=1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    c = SlurmCluster(root, nodes=2)
    with c:
        yield c
    assert our_leftover_pids(str(c.conf).encode()) == [], "a Slurm process of ours survived stop()"


def _job_output(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else f"(no {path})"


@pytest.fixture(scope="module")
def slurm_runs(cluster, tmp_path_factory):
    """Submit the 2-node batch job, run the 2-point sweep while it runs, then wait for the
    batch job (2 cores: overlapping the waits, not the work)."""
    out = tmp_path_factory.mktemp("slurm-results")
    env = cluster.env(child_env())
    job_out = out / "train-%j.out"
    sub = subprocess.run(["sbatch", "--parsable", "--nodes=2", f"--output={job_out}", "--time=10",
                          "launch/slurm/train.sbatch", *TRAIN, f"output_root={out / 'batch'}"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    sweep = subprocess.run(
        [sys.executable, "launch/train.py", "-m", "hydra/launcher=slurm",
         "hydra.launcher.nodes=1", "hydra.launcher.tasks_per_node=2", "hydra.launcher.timeout_min=10",
         *TRAIN[:1], "train.steps=4", "train.warmup_steps=1", "train.micro_batch_size=1,2",
         f"output_root={out / 'sweep'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True)
        if not q.stdout.strip():
            break
        time.sleep(1)
    info = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    return {"out": out, "job_id": job_id, "job_info": info,
            "job_log": _job_output(out / f"train-{job_id}.out"), "sweep": sweep}


@pytest.mark.slow
def test_batch_file_runs_two_node_torchrun(slurm_runs):
    log = slurm_runs["job_log"]
    assert "JobState=COMPLETED" in slurm_runs["job_info"], slurm_runs["job_info"] + log
    assert re.search(r"2 node\(s\) \[127\.0\.0\.1 127\.0\.0\.1\].*run id slurm-" + slurm_runs["job_id"], log), log
    (rec,) = records_in(slurm_runs["out"] / "batch")
    assert rec["status"] == "ok"
    # Two torchrun agents (one per slurmd node), one rank each: 2 ranks on 2 nodes.
    assert rec["world"] == {"world_size": 2, "nodes": 2, "local_world_size": 1}
    assert rec["run_id"] == f"slurm-{slurm_runs['job_id']}"
    assert rec["metrics"]["samples_per_sec"] > 0


@pytest.mark.slow
def test_submitit_sweep_of_two_points(slurm_runs):
    p = slurm_runs["sweep"]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = records_in(slurm_runs["out"] / "sweep")
    assert sorted(r["batch"]["micro_batch_size"] for r in recs) == [1, 2], [r.get("_path") for r in recs]
    for r in recs:
        assert r["status"] == "ok" and r["world"]["world_size"] == 2
    # One job array per sweep: every point's records in the same run directory.
    assert len({r["run_id"] for r in recs}) == 1 and recs[0]["run_id"].startswith("slurm-")


def test_batch_file_bad_input_fails_in_one_line(cluster, tmp_path):
    env = cluster.env(child_env(FB_NPROC_PER_NODE="two"))
    p = subprocess.run(["sbatch", "--wait", "--nodes=1", f"--output={tmp_path}/bad-%j.out", "--time=2",
                        "launch/slurm/train.sbatch", "fabric=loopback"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    (out,) = tmp_path.glob("bad-*.out")
    assert out.read_text().strip() == "error: FB_NPROC_PER_NODE=two is not a positive integer"


def test_batch_file_outside_slurm_says_so():
    env = {k: v for k, v in child_env().items() if not k.startswith("SLURM_")}
    p = subprocess.run(["bash", "launch/slurm/train.sbatch", "fabric=loopback"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "run this file with sbatch" in p.stderr


def test_batch_files_parse_and_quote():
    """bash -n on every file; and no unquoted expansion of a user value reaches a command."""
    for f in sorted((REPO / "launch" / "slurm").iterdir()):
        if f.suffix in (".sh", ".sbatch"):
            subprocess.run(["bash", "-n", str(f)], check=True)
            for n, line in enumerate(f.read_text().splitlines(), 1):
                code = line.split("#", 1)[0] if not line.lstrip().startswith("#SBATCH") else ""
                assert "eval " not in code, f"{f.name}:{n} evaluates a string"
                assert not re.search(r'(?<!["$({\w])\$@', code), f"{f.name}:{n}: unquoted $@"


def test_cluster_stops_every_daemon(tmp_path):
    """A cluster of our own, stopped: munged, slurmctld and slurmd all gone, and no
    process refers to its slurm.conf."""
    c = SlurmCluster(tmp_path, nodes=1)
    with c:
        pids = {k: p.pid for k, p in c.procs.items()}
        assert set(pids) == {"munged", "slurmctld", "slurmd-n1"}
    for key, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/status").read_text().find("zombie") >= 0, key
    assert our_leftover_pids(str(c.conf).encode()) == []
