"""`srun --container` on the project's one-machine Slurm (Debian's 22.05: Slurm's own OCI support,
runc, launch/slurm/oci.conf): the 2-node collectives batch job with FB_OCI_BUNDLE runs each node's
torchrun agent in the cpu image and writes a record equal in shape, software and world to the same
job without a container, its fingerprint saying `slurm-runc`. Slurm 22.05 leaves the per-task
variables out of a container (docs/cluster.md); the task prolog and oci_run.sh carry them in:
without them torchrun_node.sh stops at `SLURM_NODEID: run under srun`, and with both nodes taking
one node id the rendezvous would never see two nodes (the record's world says it did)."""

from __future__ import annotations

import subprocess

import pytest

from helpers import REPO, child_env, records_in
from helpers.image import assert_same_but_container, cpu_image
from helpers.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.requires("root", "slurm", "podman"), pytest.mark.slow]
COLLECTIVES = ["fabric=loopback", "collectives.maxbytes=64K", "collectives.iters=5", "collectives.warmup_iters=2"]


def _submit(cluster: SlurmCluster, out, name: str, **env: str) -> tuple[str, str]:
    e = cluster.env(child_env(FABRICBENCH_RUN_ID=name, **env))
    p = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=2", f"--output={out}/{name}-%j.out", "--time=10",
                        "launch/slurm/collectives.sbatch", *COLLECTIVES, f"output_root={out / name}"],
                       cwd=REPO, env=e, capture_output=True, text=True, timeout=600)
    job = p.stdout.strip().split(";")[0]
    logs = sorted(out.glob(f"{name}-*.out"))
    log = logs[0].read_text(errors="replace") if logs else "(no job log)"
    assert p.returncode == 0, f"{name}: sbatch exit {p.returncode}\n{p.stderr}\n{log[-4000:]}\n{cluster.logs()}"
    return job, log


def test_srun_container_job_matches_the_job_without(tmp_path_factory):
    tag = cpu_image()
    root = tmp_path_factory.mktemp("s")
    out = tmp_path_factory.mktemp("oci-results")
    bundle, runc_root = root / "bundle", root / "runc"
    made = subprocess.run(["bash", str(REPO / "tools/oci_bundle.sh"), tag, str(bundle), str(REPO), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    try:
        with SlurmCluster(root, nodes=2) as c:
            # oci.conf is read by each step's slurmstepd, beside the slurm.conf it was given.
            # runc's state in the test's own folder: a container a killed run left behind cannot
            # clash with the next cluster's job 1, nor touch the machine's.
            conf = (REPO / "launch/slurm/oci.conf").read_text().replace("FB_HOME", str(REPO)) \
                .replace("/run/fabricbench-runc", str(runc_root))
            (c.conf.parent / "oci.conf").write_text(conf)
            _, log_c = _submit(c, out, "container", FB_OCI_BUNDLE=str(bundle))
            (c.conf.parent / "oci.conf").unlink()
            _, log_h = _submit(c, out, "host")
    finally:
        if runc_root.is_dir():
            for cid in runc_root.iterdir():
                subprocess.run(["runc", f"--root={runc_root}", "delete", "--force", cid.name], timeout=60)
        subprocess.run(["bash", str(REPO / "tools/oci_bundle.sh"), "--remove", str(bundle)], timeout=120)
    (rec_c,) = records_in(out / "container")
    (rec_h,) = records_in(out / "host")
    assert_same_but_container(rec_c, rec_h, "slurm-runc")
    assert rec_c["world"] == {"world_size": 2, "nodes": 2, "local_world_size": 1}, rec_c["world"]
