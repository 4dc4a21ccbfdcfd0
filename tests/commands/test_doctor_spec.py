"""`fabricbench doctor --spec`: the container flags users write, read statically for the
settings under which NCCL would quietly leave the fabric (fixtures in tests/fixtures/runspec,
each citing the format it follows), and the project's own batch files and documented docker
run pass."""

from __future__ import annotations

import re

import pytest

from helpers import FIXTURES, REPO, SLURM_DIR
from workloads.commands import cli

SPECS = FIXTURES / "runspec"


def lint(capsys, *args: str) -> tuple[int, list[str]]:
    rc = cli.main(["doctor", *args])
    out = capsys.readouterr().out
    return rc, [line.strip()[len("FAIL: "):] for line in out.splitlines() if line.strip().startswith("FAIL: ")]


def test_docker_and_podman_run_lines(capsys):
    rc, fails = lint(capsys, "--spec", str(SPECS / "docker_runs.sh"), "fabric=roce")
    by_line: dict[int, list[str]] = {}
    for f in fails:
        n = int(re.match(r".*docker_runs\.sh:(\d+): ", f).group(1))
        by_line.setdefault(n, []).append(f)
    assert rc == 1 and sorted(by_line) == [6, 14, 21, 22], fails
    defaults = " | ".join(by_line[6])
    assert len(by_line[6]) == 4
    assert "fix: add --network=host" in defaults and "no socket interface found" in defaults
    assert "fix: add --device=/dev/infiniband" in defaults and "fix: add --ulimit memlock=-1" in defaults
    # CAP_IPC_LOCK lifts memlock only for root in the initial user namespace (capable(), ib_umem_get)
    assert len(by_line[21]) == 1 and "--user 1000 with --cap-add=IPC_LOCK: a non-root user's capability" in by_line[21][0]
    assert len(by_line[22]) == 1 and "--userns=keep-id: in a user namespace CAP_IPC_LOCK lifts no limit" in by_line[22][0]
    assert "fix: add --ipc=host or --shm-size=16g" in defaults
    # memlock=-1 without IPC_LOCK is enough to pin; the 512m /dev/shm is the one problem
    assert len(by_line[14]) == 1 and by_line[14][0].split(": ", 1)[1].startswith("--shm-size=512m: /dev/shm is below 1 GiB")


def test_pyxis_mounts_and_the_host_network(capsys, tmp_path):
    """An explicit /dev/infiniband in pyxis's --container-mounts needs no enroot hook (enroot's
    99-mellanox reads MELLANOX_VISIBLE_DEVICES only to mount the devices itself); a bridge
    network is not the host's."""
    job = tmp_path / "job.sbatch"
    job.write_text("#!/bin/sh\nsrun --container-image=nvcr.io#nvidia/pytorch:24.05-py3 "
                   "--container-mounts=/dev/infiniband:/dev/infiniband python train.py\n"
                   "srun --container-image=nvcr.io#nvidia/pytorch:24.05-py3 python train.py\n"
                   "docker run --network=bridge --ipc=host --device=/dev/infiniband --ulimit memlock=-1 x true\n")
    rc, fails = lint(capsys, "--spec", str(job), "fabric=roce")
    assert rc == 1 and [f.split(": ", 1)[0] for f in fails] == [f"{job}:3", f"{job}:4"], fails
    assert "--container-mounts=/dev/infiniband" in fails[0] and fails[1].split(": ", 1)[1].startswith("--network=bridge")


def test_kubernetes_pod_specs(capsys):
    rc, fails = lint(capsys, "--spec", str(SPECS / "pods.yaml"), "fabric=ib")
    assert rc == 1
    who = [re.match(r".*pods\.yaml: (\S+) container trainer: ", f).group(1) for f in fails]
    assert who == ["pod/defaults"] * 3 + ["job/small-shm"], fails
    assert "rdma/rdma_shared_device_a: 1" in fails[0] and "capabilities.add: [IPC_LOCK]" in fails[1]
    assert "emptyDir: {medium: Memory} mounted at /dev/shm" in fails[2] and "sizeLimit" in fails[3]


def test_a_gloo_profile_needs_none_of_it(capsys):
    assert cli.main(["doctor", "--spec", str(SPECS / "docker_runs.sh"), "--spec", str(SPECS / "pods.yaml"),
                     "fabric=loopback"]) == 0
    assert "OK: every container setting the profile needs is there" in capsys.readouterr().out


@pytest.mark.parametrize("fabric", ["roce", "ib"])
def test_the_projects_batch_files_and_documented_run_pass(capsys, fabric):
    """lib.sh's pyxis path sets MELLANOX_VISIBLE_DEVICES (enroot's 99-mellanox hook mounts the HCAs
    only then), and docs/cluster.md's GPU `docker run` has every flag; its CPU `podman run`
    (make train in the cpu image) is not a fabric run and is left out by line."""
    files = [str(p) for p in sorted(SLURM_DIR.glob("*.sbatch"))] + [str(SLURM_DIR / "lib.sh")]
    rc, fails = lint(capsys, *(a for f in files for a in ("--spec", f)), f"fabric={fabric}")
    assert rc == 0 and not fails, fails
    docs = REPO / "docs" / "cluster.md"
    gpu_run = next(n for n, line in enumerate(docs.read_text().splitlines(), 1)
                   if line.startswith("docker run") and "--gpus" in line)
    _, fails = lint(capsys, "--spec", str(docs), f"fabric={fabric}")
    assert not [f for f in fails if f.startswith(f"{docs}:{gpu_run}: ")], fails


def test_usage_errors_are_one_line(capsys, tmp_path):
    assert cli.main(["doctor", "--spec", str(tmp_path / "absent.sh"), "fabric=roce"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "absent.sh: no such file" in err, err
    assert cli.main(["doctor", "--spec", str(SPECS / "pods.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "e.g. fabricbench doctor --spec FILE fabric=roce" in err, err
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    rc, fails = lint(capsys, "--spec", str(tmp_path / "bad.yaml"), "fabric=roce")
    assert rc == 1 and len(fails) == 1 and "not YAML" in fails[0]


def test_oci_bundle_configs(capsys):
    """`srun --container`'s bundle: runc's own default config.json lacks all three settings, the
    ready one (tests/fixtures/runspec/oci/README.md) passes, a 512 MiB /dev/shm is one problem;
    a Gloo profile needs none of them."""
    oci = SPECS / "oci"
    rc, fails = lint(capsys, "--spec", str(oci / "runc_spec_default.json"), "fabric=ib")
    assert rc == 1 and len(fails) == 3, fails
    assert "fix: add each /dev/infiniband/uverbsN" in fails[0]
    assert "fix: add CAP_IPC_LOCK to process.capabilities" in fails[1] and "RLIMIT_MEMLOCK" in fails[1]
    assert fails[2].split(": ", 1)[1].startswith("/dev/shm mounted with size=65536k: ") and "size=16g" in fails[2]
    rc, fails = lint(capsys, "--spec", str(oci / "ready.json"), "fabric=ib")
    assert rc == 0 and not fails, fails
    rc, fails = lint(capsys, "--spec", str(oci / "small_shm.json"), "fabric=roce")
    assert rc == 1 and len(fails) == 1 and "size=512m" in fails[0], fails
    assert cli.main(["doctor", "--spec", str(oci / "runc_spec_default.json"), "fabric=loopback"]) == 0
    capsys.readouterr()


def test_rootless_and_non_root_bundles_say_what_ibv_reg_mr_will_do(capsys):
    """`runc spec --rootless` with CAP_IPC_LOCK added: the capability is the bundle's user
    namespace's and lifts nothing; a non-root process.user loses a non-ambient capability at exec
    (tests/fixtures/runspec/oci/README.md)."""
    oci = SPECS / "oci"
    rc, fails = lint(capsys, "--spec", str(oci / "rootless_ipc_lock.json"), "fabric=ib")
    assert rc == 1 and len(fails) == 1 and "runs in a user namespace" in fails[0], fails
    assert "ibv_reg_mr fails with ENOMEM" in fails[0] and "LimitMEMLOCK=infinity" in fails[0]
    rc, fails = lint(capsys, "--spec", str(oci / "nonroot_ipc_lock.json"), "fabric=ib")
    assert rc == 1 and len(fails) == 1 and "process.user.uid 1000 with CAP_IPC_LOCK in effective but not in ambient" \
        in fails[0], fails


def test_a_json_file_that_is_no_oci_config(capsys, tmp_path):
    (tmp_path / "x.json").write_text('{"a": 1}')
    (tmp_path / "y.json").write_text('{"a": ')
    rc, fails = lint(capsys, "--spec", str(tmp_path / "x.json"), "--spec", str(tmp_path / "y.json"), "fabric=ib")
    assert rc == 1 and "not an OCI runtime config (no ociVersion)" in fails[0] and "not JSON" in fails[1], fails


@pytest.mark.parametrize("process,needle", [
    ({"env": "NCCL_DEBUG=INFO"}, "process.env is a string, not an array"),
    ({"env": ["NCCL_DEBUG"]}, 'process.env holds "NCCL_DEBUG", not a NAME=value string'),
    ({"env": [], "rlimits": {"type": "RLIMIT_MEMLOCK"}}, "process.rlimits is an object, not an array"),
    ("sh", "process is a string, not an object"),
])
def test_a_malformed_oci_field_is_named_not_read_as_absent(capsys, tmp_path, process, needle):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": process}))
    rc, fails = lint(capsys, "--spec", str(tmp_path / "config.json"), "fabric=ib")
    # one line for the bundle, not the device and memlock problems of a config read as empty
    assert rc == 1 and len(fails) == 1 and needle in fails[0] and "fix the bundle's config.json" in fails[0], fails
