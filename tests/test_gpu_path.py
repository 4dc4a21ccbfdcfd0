"""The review of the GPU code paths (../shared/reviews/gpu-path.md), one test per finding,
each written to fail on the code before its fix. Nothing here needs a GPU: NCCL logs are
fixtures written from NCCL's/RCCL's own format strings (tests/fixtures/nccl_logs/*, each
file's header names the source file and version), and every other check is a pure
function or a real one-rank Gloo process group."""

from pathlib import Path

import pytest
import torch
import yaml

from workloads.collectives import ops
from workloads.fabric import nccl_log, nic, verify
from workloads.fabric.profile import FabricProfile
from workloads.core.dist import free_port

LOGS = Path(__file__).parent / "fixtures" / "nccl_logs"
CONF = Path(__file__).parent.parent / "conf" / "fabric"


def profile(name: str, **expect) -> FabricProfile:
    cfg = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    cfg["expect"] = {**cfg["expect"], **expect}
    return FabricProfile.from_config(cfg)


def evidence(case: str) -> list[dict]:
    logs = sorted(nccl_log.parse_dir(LOGS / case), key=lambda lg: lg.rank if lg.rank is not None else 0)
    return [{"kind": "nccl", "log": lg.as_dict()} for lg in logs]


# ---- #3 GPUDirect RDMA: /GDRDMA/Shared (p2p connections) and GDRDMA(PCI) (C2C, >= 2.26) ----

def test_gdr_suffixes_are_gdr():
    for via in ("NET/IB/0/GDRDMA/Shared", "NET/IB/2/GDRDMA(PCI)", "NET/IB/1(1)/GDRDMA(PCI)/Shared",
                "NET/IB/0(1)/GDRDMA"):
        assert nccl_log.transport_key(via) == ("NET/IB", True), via
    assert nccl_log.transport_key("NET/IB/0/Shared") == ("NET/IB", False)
    assert nccl_log.transport_key("NET/Socket/0") == ("NET/Socket", False)


@pytest.mark.parametrize("case, fabric", [("nccl_2.20_roce_shared", "roce"), ("nccl_2.29_c2c_pci", "ib"),
                                          ("rccl_2.2x_ib", "roce")])
def test_gdr_runs_pass_expect_gdr(case, fabric):
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / case))
    assert s["gdr"] is True and s["gdr_channels"] == s["net_channels"] > 0
    d = verify.decide(profile(fabric, gdr=True), evidence(case), environ={})
    assert d["verdict"] == "ok", d["message"]


def test_fixture_counts_per_version():
    # 2.20 (2.18-2.25 form): 2 ring sends + 2 p2p /Shared sends per rank, counted on the sender
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_2.20_roce_shared"))
    assert s["channels"] == {"NET/IB": 8} and s["version"] == "2.20.3+cuda12.3"
    # 2.29: PXN `(1)` and (PCI)/Shared sends, one CollNet send, the GRAPH line's NVL intra path
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_2.29_c2c_pci"))
    assert s["channels"] == {"COLLNET": 1, "NET/IB": 6} and s["net_channels"] == 6
    assert s["collnet_channels"] == 1 and s["graph_types"] == ["NVL"]
    # RCCL 2.2x: the ` comm 0x... nRanks 02` trailer is cut, ranks come from `rank r nranks 2`
    logs = nccl_log.parse_dir(LOGS / "rccl_2.2x_ib")
    assert [lg.rank for lg in logs] == [0, 1] and {lg.library for lg in logs} == {"RCCL"}
    assert nccl_log.summarize(logs)["channels"] == {"NET/IB": 6}


# ---- #16 NCCL 2.30 device tokens keep their port; CollNet; Bootstrap ----

def test_rail_suffix_keeps_the_port_and_nic_rails_name_real_ports():
    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_2.30_rail_suffix"))
    assert [(d["name"], d["port"], d["link_layer"]) for d in s["devices"]] == [("mlx5_0", 1, "IB"), ("mlx5_1", 1, "IB")]
    transport = verify.decide(profile("ib"), evidence("nccl_2.30_rail_suffix"), environ={})
    assert transport["verdict"] == "ok"
    assert nic.rails_for(profile("ib"), {}, transport) == ["rdma:mlx5_0:1", "rdma:mlx5_1:1"]


def test_merged_and_data_direct_devices_map_to_physical_rails():
    transport = {"summary": {"devices": [{"name": "mlx5_0+mlx5_1", "port": 1}, {"name": "mlx5_2_dma", "port": 1}]}}
    assert nic.rails_for(profile("ib"), {}, transport) == ["rdma:mlx5_0:1", "rdma:mlx5_1:1", "rdma:mlx5_2:1"]


def test_bootstrap_subsystem_is_logged_and_parsed():
    env: dict = {}
    profile("roce").apply("/tmp/fb-run", env)
    assert "BOOTSTRAP" in env["NCCL_DEBUG_SUBSYS"].split(",")
    logs = nccl_log.parse_dir(LOGS / "nccl_2.22_lazy_connect")
    assert [lg.bootstrap for lg in logs] == ["eth0:10.0.0.1", "eth0:10.0.0.2"]


# ---- #2 a rank with no channel is unverified when the profile has channel rules ----

def test_no_channel_yet_is_unverified_not_ok():
    d = verify.decide(profile("roce"), evidence("nccl_2.22_lazy_connect"), environ={})
    assert d["verdict"] == "unverified"
    assert "ranks 0, 1 logged no channel" in d["message"]
    # a profile without channel rules has nothing to check there
    bare = FabricProfile("roce-net-only", "nccl", expect={"network": "IB", "link_layer": "RoCE"})
    assert verify.decide(bare, evidence("nccl_2.22_lazy_connect"), environ={})["verdict"] == "ok"


def test_warmup_collectives_run_before_the_log_is_read(monkeypatch, tmp_path):
    """The reference engine reads its own log after a real all_reduce: warmup_collectives
    issues a tiny and a multi-MB one (a real one-rank Gloo group here)."""
    import torch.distributed as dist

    from workloads.core import dist as fdist

    sizes = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, **kw: (sizes.append(t.numel()), real(t, **kw))[1])
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        fdist.warmup_collectives(torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert sizes == [1, 1 << 20]


def test_reference_server_warms_up_before_check_transport(tmp_path):
    """run_server itself, in its own one-rank process (Gloo, a real tiny engine): when it reads
    the transport, the tiny and the multi-MB all_reduce have run. A spy stands where NCCL's log
    would be read and stops the server there (it would serve forever)."""
    import subprocess
    import sys

    from conftest import REPO, child_env

    script = f"""
import sys, torch.distributed as dist
from workloads.core import launcher, rundir
from workloads.inference.engine import run
sizes, real = [], dist.all_reduce
dist.all_reduce = lambda t, **kw: (sizes.append(t.numel()), real(t, **kw))[1]
def spy(fabric, run_dir, info):
    print("AT CHECK", sizes, flush=True)
    raise SystemExit(0)
run.check_transport = spy
rundir.register_resolvers()
cfg = launcher.compose(launcher.CONF_DIR, ["model=neox-tiny", "fabric=loopback", "output_root={tmp_path}"], "serve")
run.run_server(cfg)
"""
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=child_env(), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "AT CHECK [1, 1048576]" in r.stdout, r.stdout[-2000:]


# ---- #4 fabric=pcie rejects NVLink ----

def test_pcie_label_rejects_an_nvlink_box():
    d = verify.decide(profile("pcie"), evidence("nccl_nvlink_box"), environ={})
    assert d["verdict"] == "mismatch"
    assert "ranks 0–3 found intra-node paths of type NVL" in d["message"]
    assert verify.decide(profile("pcie"), evidence("nccl_pcie"), environ={})["verdict"] == "ok"
    assert profile("pcie").env["NCCL_NVLS_ENABLE"] == "0"


def test_pcie_label_without_graph_lines_is_unverified():
    p = profile("pcie")
    ranks = [e["log"] | {"graph_types": []} for e in evidence("nccl_pcie")]
    d = verify.decide(p, [{"kind": "nccl", "log": r} for r in ranks], environ={})
    assert d["verdict"] == "unverified" and "logged no GRAPH line" in d["message"]


# ---- #1 / #16 serving: one log per TP rank, and only this server's logs ----

def test_server_transport_needs_one_log_per_rank(tmp_path):
    import shutil

    shutil.copytree(LOGS / "nccl_roce", tmp_path / "nccl")
    ok = verify.server_transport(profile("roce"), tmp_path, ranks=2)
    assert ok["verdict"] == "ok"
    short = verify.server_transport(profile("roce"), tmp_path, ranks=4)
    assert short["verdict"] == "unverified" and "2 of 4 rank log(s)" in short["message"]


def test_server_transport_ignores_logs_of_an_earlier_server(tmp_path):
    import os
    import shutil
    import time

    shutil.copytree(LOGS / "nccl_socket_fallback", tmp_path / "nccl")
    for p in (tmp_path / "nccl").iterdir():
        os.utime(p, (time.time() - 3600, time.time() - 3600))  # a resumed run's old server
    shutil.copy(LOGS / "nccl_roce" / "nccl.node1.4100.log", tmp_path / "nccl")
    shutil.copy(LOGS / "nccl_roce" / "nccl.node2.4101.log", tmp_path / "nccl")
    d = verify.server_transport(profile("roce"), tmp_path, ranks=2, since=time.time() - 60)
    assert d["verdict"] == "ok" and d["summary"]["processes"] == 2


# ---- #10 the correctness check never holds n full-size tensors ----

def _naive(op, lay, comm, root, redop, dtype):
    """The pre-fix reference: every rank's full input, then one reduction/concatenation."""
    n, c = comm.size, lay.count
    full = [ops.values(lay.send_numel, r, dtype, "cpu") for r in range(n)]
    if op.name == "all_reduce":
        return ops.reduce_reference([f[:c] for f in full], redop, dtype)
    if op.name == "reduce_scatter":
        return ops.reduce_reference([f[comm.rank * c:(comm.rank + 1) * c] for f in full], redop, dtype)
    if op.name == "all_gather":
        return torch.cat([f[:c] for f in full])
    if op.name == "alltoall":
        return torch.cat([f[comm.rank * c:(comm.rank + 1) * c] for f in full])
    return None


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "all_gather", "alltoall"])
@pytest.mark.parametrize("redop", ["sum", "prod", "max", "avg"])
def test_sliced_expected_equals_the_whole_reference(name, redop):
    op = ops.get(name)
    dtype = torch.float32 if redop == "avg" else torch.int32
    for n in (3, 4):
        lay = op.layout(4 * 1000, 4, n)
        comm = ops.Comm(None, 1, n, tuple(range(n)))
        want = _naive(op, lay, comm, 0, redop, dtype)
        numel = op.checked_numel(lay)
        pieces = [op.expected_slice(lay, comm, 0, redop, dtype, "cpu", lo, min(numel, lo + 77))
                  for lo in range(0, numel, 77)]
        assert torch.equal(torch.cat(pieces), want), (name, redop, n)


def test_check_never_materialises_full_size_tensors(monkeypatch):
    """Count the elements of every input pattern the check builds: with CHECK_CHUNK = 1000 and
    a 16 000-element buffer over 8 ranks, no temporary is larger than one slice."""
    from tests.test_collectives_bw import _settings
    from workloads.collectives import harness

    asked = []
    real = ops.values
    monkeypatch.setattr(ops, "values", lambda numel, *a, **k: (asked.append(numel), real(numel, *a, **k))[1])
    monkeypatch.setattr(harness, "CHECK_CHUNK", 1000)
    s = _settings("collectives.minbytes=64K", "collectives.maxbytes=64K", "collectives.datatype=int32")
    n = 8
    for name in ("all_reduce", "reduce_scatter", "all_gather", "alltoall"):
        op = ops.get(name)
        comm = ops.Comm(None, 0, n, tuple(range(n)))
        h = harness.Harness(s, comm, torch.device("cpu"), "gloo", 0)
        lay = op.layout(64 * 1024, 4, n)
        b = op.buffers(lay, comm, 0, torch.int32, "cpu", op.placements[0])
        b.checked.copy_(_naive(op, lay, comm, 0, "sum", torch.int32))  # what a correct collective leaves
        asked.clear()
        assert h.count_wrong_in(op, lay, b) == 0
        assert asked and max(asked) <= 1000, (name, max(asked))
        b.checked.view(-1)[-1] += 1
        assert h.count_wrong_in(op, lay, b) == 1


# ---- #13 per-task GPU binding ----

def test_device_index_under_per_task_binding():
    from workloads.core.dist import device_index

    assert [device_index(r, 1) for r in range(4)] == [0, 0, 0, 0]  # one visible GPU per task
    assert [device_index(r, 8) for r in (0, 5, 7)] == [0, 5, 7]
    assert device_index(3, 2) == 1 and device_index(2, 0) == 0


# ---- #6 the external nccl-tests run: same split, nothing of ours beside it ----

def _nccl_tests_on_path(tmp_path, monkeypatch) -> Path:
    """`all_reduce_perf` and `mpirun` shims running tests/nccl_tests_emulator.py, which
    reproduces how nccl-tests colours processes and numbers ranks (its docstring cites the
    lines); each run's argv is appended to bindir/argv."""
    import os
    import sys

    emulator = Path(__file__).parent / "nccl_tests_emulator.py"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, role in (("all_reduce_perf", "perf"), ("mpirun", "mpirun")):
        (bindir / name).write_text(f'#!/bin/sh\nexec {sys.executable} {emulator} {role} "$@"\n')
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCCL_TESTS_ARGV", str(bindir / "argv"))
    return bindir


def _plan(tmp_path, pattern, world, rpn, prefix=None):
    from tests.test_collectives_bw import _settings
    from workloads.collectives import nccltests
    from workloads.core.dist import DistInfo

    over = ["collectives.minbytes=1M", "collectives.maxbytes=2M", f"collectives.pattern={pattern}"]
    if prefix is not None:
        over.append("collectives.external_prefix=[" + ",".join(f"'{a}'" for a in prefix) + "]")
    s = _settings(*over, world=world)
    return nccltests.run_planned(s, tmp_path / "ext", DistInfo(0, world, 0, rpn, "nccl", torch.device("cpu")), rpn)


def test_split_external_run_is_one_process_per_gpu_and_measures_our_groups(tmp_path, monkeypatch):
    """2 nodes x 8 GPUs, pattern=one_per_node: nccl-tests colours MPI processes (common.cu
    run(): color = proc % 8), so only -g 1 under a launcher of {world} processes gives our 8
    communicators of one rank per node; the record keeps the groups the binary printed."""
    from workloads.collectives.settings import pattern_groups

    bindir = _nccl_tests_on_path(tmp_path, monkeypatch)
    block = _plan(tmp_path, "one_per_node", 16, 8, ["mpirun", "-np", "{world}", "-N", "{ranks_per_node}"])
    assert block["status"] == "ok", block.get("reason")
    assert block["command"][:5] == ["mpirun", "-np", "16", "-N", "8"] and block["gpus"] == 1
    assert block["env"] == {"NCCL_TESTS_SPLIT": "MOD 8"} and block["scope"] == "job"
    assert block["groups"] == pattern_groups("one_per_node", 16, 8) and block["groups"][3] == [3, 11]
    assert (bindir / "argv").read_text().split()[-2:] == ["-g", "1"]


def test_external_run_that_measured_other_communicators_is_failed_not_recorded_as_ours(tmp_path, monkeypatch):
    """The layout the old docs gave (one process per node driving its 8 GPUs): every GPU of
    a process shares its colour, so "MOD 8" makes each node its own NVLink communicator."""
    from workloads.collectives import nccltests

    _nccl_tests_on_path(tmp_path, monkeypatch)
    block = _plan(tmp_path, "one_per_node", 16, 8, ["mpirun", "-np", "{nodes}", "-N", "1"])
    assert block["status"] == "failed" and block["groups"] == [[0], [1]]  # -g 1 x 2 processes: 2 ranks
    assert block["rows"] == [] and block["avg_busbw"] is None  # its figures are not kept beside ours
    assert "one process per GPU" in block["reason"] and "[[0, 8], [1, 9], ... (8 groups)]" in block["reason"]
    line = nccltests.summary_line(block)
    assert line.startswith("# external ") and "failed: it measured communicators [[0], [1]]" in line
    assert "avg bus bandwidth" not in line


def test_split_pattern_without_a_launcher_is_not_run(tmp_path, monkeypatch):
    """One process cannot be split (there is no MPI_Comm_split without MPI processes): the
    binary would measure all local GPUs as one communicator under a split label."""
    bindir = _nccl_tests_on_path(tmp_path, monkeypatch)
    block = _plan(tmp_path, "pairs", 8, 8)
    assert block["status"] == "skipped" and "needs collectives.external_prefix" in block["reason"]
    assert not (bindir / "argv").exists()
    # pattern=all on one node needs no launcher: one process, -g <local ranks>, one group
    block = _plan(tmp_path, "all", 8, 8)
    assert block["status"] == "ok" and block["gpus"] == 8 and block["groups"] == [list(range(8))]


def test_external_prefix_placeholders_are_checked_with_the_settings():
    from tests.test_collectives_bw import _settings
    from workloads.collectives.settings import launch_prefix
    from workloads.core.errors import UsageError

    assert launch_prefix(["srun", "-n", "{world}", "--ntasks-per-node={ranks_per_node}"], 16, 2, 8) == \
        ["srun", "-n", "16", "--ntasks-per-node=8"]
    with pytest.raises(UsageError, match="placeholder other than"):  # every rank, before the sweep
        _settings("collectives.external_prefix=[mpirun,-np,'{gpus}']")


def _external_rank(rank: int, tmp: str, path_env: str) -> None:
    import os
    import time

    import torch.distributed as dist

    from tests.test_collectives_bw import _settings
    from workloads.collectives.nccltests import run_external_alone
    from workloads.core import dist as fdist
    from workloads.core.dist import DistInfo

    os.environ["PATH"] = path_env
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    s = _settings("collectives.minbytes=1M", "collectives.maxbytes=2M", "collectives.external=on")
    block = run_external_alone(s, Path(tmp) / "ext", DistInfo(rank, 2, rank, 2, "gloo", None), 2)
    Path(tmp, f"left.{rank}").write_text(repr(time.time()))
    if rank == 0:
        Path(tmp, "status").write_text(block["status"])
    fdist.close()


@pytest.mark.slow
def test_other_ranks_wait_on_the_host_while_rank0_runs_the_binary(tmp_path):
    """Two real Gloo processes: rank 1 must not leave before rank 0's stand-in binary (it
    needs a GPU, so a script sleeps 1.5 s and stamps its end) has finished."""
    import os
    import sys

    import torch.multiprocessing as mp

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "all_reduce_perf"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "-h" ] && exit 0\nsleep 1.5\n'
                    f'python3 -c "import time; print(repr(time.time()))" > {bindir}/ended\n'
                    f'FAKE_NCCL_TESTS_ARGV={bindir}/argv exec {sys.executable} '
                    f'{Path(__file__).parent / "nccl_tests_emulator.py"} perf "$@"\n')
    fake.chmod(0o755)
    mp.spawn(_external_rank, args=(str(tmp_path), f"{bindir}{os.pathsep}{os.environ['PATH']}"), nprocs=2)
    assert (tmp_path / "status").read_text() == "ok"
    ended = float((bindir / "ended").read_text())
    assert float((tmp_path / "left.1").read_text()) >= ended


# ---- #1 multi-node serving: the workers of nodes > 0 run under the same fabric profile ----

def test_worker_node_gets_the_fabric_profile_and_nccl_log(tmp_path):
    """serve_node.sh as srun runs it on node 1 of a 2-node SGLang job. The engine needs a GPU,
    so FB_ENGINE_PYTHON is a stand-in that writes the environment it was started with."""
    import json
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    fake = tmp_path / "engine-python"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'env': dict(os.environ), 'argv': sys.argv[1:]}}, open({str(tmp_path / 'seen.json')!r}, 'w'))\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SLURM_", "FB_", "FABRICBENCH_"))}
    env.update(FB_ENGINE="sglang", FB_MODEL_PATH="/models/m", FB_TP="16", FB_DIST_ADDR="10.0.0.1:29500",
               FB_SERVE_PORT="30000", SLURM_NODEID="1", SLURM_JOB_NUM_NODES="2", FB_NODE_ADDRS="10.0.0.1 10.0.0.2",
               FB_PYTHON=sys.executable, FB_HOME=str(repo), FB_ENGINE_PYTHON=str(fake),
               FABRICBENCH_RUN_ID="slurm-42")
    r = subprocess.run(["bash", str(repo / "launch/slurm/serve_node.sh"), "fabric=roce", "model=llama-3.1-8b",
                        f"output_root={tmp_path / 'results'}"], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    e = seen["env"]
    assert (e["NCCL_IB_HCA"], e["NCCL_IB_GID_INDEX"], e["NCCL_IB_TC"]) == ("mlx5", "3", "106")
    assert e["NCCL_DEBUG"] == "INFO" and "NET" in e["NCCL_DEBUG_SUBSYS"]
    assert e["NCCL_DEBUG_FILE"] == str(tmp_path / "results" / "slurm-42" / "nccl" / "nccl.%h.%p.log")
    assert seen["argv"][:2] == ["-m", "sglang.launch_server"] and "--node-rank" in seen["argv"]


def test_profile_exec_usage_and_bad_fabric_fail_in_one_line():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "workloads.fabric.profile", "exec", "fabric=roce"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("usage:")
    r = subprocess.run([sys.executable, "-m", "workloads.fabric.profile", "exec", "fabric=nope", "--", "true"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3, r.stderr


# ---- #5 the CPU affinity is recorded and a squeezed node warned about ----

def test_cpu_affinity_in_the_fingerprint_and_the_warning():
    import os

    from workloads.core.records import fingerprint
    from workloads.core.session import affinity_warning

    assert fingerprint()["cpu_affinity"] == len(os.sched_getaffinity(0))
    assert affinity_warning(1, 8).startswith("this process may run on 1 CPU(s)")
    assert affinity_warning(16, 8) is None and affinity_warning(None, 8) is None


def test_batch_files_give_each_task_its_cpus():
    slurm = Path(__file__).resolve().parent.parent / "launch" / "slurm"
    for name in ("train.sbatch", "collectives.sbatch", "inference.sbatch"):
        assert "\n#SBATCH --exclusive\n" in (slurm / name).read_text(), name
    lib = (slurm / "lib.sh").read_text()
    assert "--whole --cpu-bind=none" in lib and "$FB_MODEL_PATH:$FB_MODEL_PATH" in lib


def test_multi_node_serving_job_ends_after_the_sweep():
    """#11: node 0's sweep exits 0 and --kill-on-bad-exit never fires; srun --wait ends the
    engine workers of the other nodes (shown with bash -x: srun is not run)."""
    import subprocess

    slurm = Path(__file__).resolve().parent.parent / "launch" / "slurm"
    assert 'FB_SRUN_WAIT="${FB_SRUN_WAIT:-60}"' in (slurm / "inference.sbatch").read_text()
    script = (f'srun() {{ printf "%s\\n" "$@"; }}; source {slurm / "lib.sh"}; SLURM_JOB_NUM_NODES=2 '
              'FB_HOME=/x FB_SRUN_WAIT=60 fb_srun_per_node true')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30).stdout.split()
    assert "--wait=60" in out and "--kill-on-bad-exit=1" in out and "--whole" in out


# ---- #17 the engine's own torch/NCCL in a serving record; the peak table ----

def test_engine_versions_come_from_the_engines_interpreter(tmp_path):
    import sys

    from workloads.inference.engine_info import engine_versions, interpreter_of

    ours = engine_versions([sys.executable, "-m", "torch.distributed.run"])  # the reference engine
    assert ours["python"] == sys.executable and ours["torch"] == torch.__version__
    # a console script (`vllm`) runs on the interpreter of its shebang
    cli = tmp_path / "vllm"
    cli.write_text(f"#!{sys.executable}\nprint('serve')\n")
    cli.chmod(0o755)
    assert interpreter_of(str(cli)) == sys.executable
    assert engine_versions([str(cli), "serve", "m"])["torch"] == torch.__version__
    assert engine_versions(None) is None  # an external server: nothing started, nothing to ask
    assert "cannot tell" in engine_versions([str(tmp_path / "missing")])["error"]


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA B200", 2250.0), ("NVIDIA GB200", 2500.0), ("AMD Instinct MI325X", 1300.0),
    ("AMD Instinct MI355X", 2516.6), ("NVIDIA H100 80GB HBM3", 989.0), ("AMD Instinct MI300X", 1300.0),
    ("NVIDIA H100 PCIe", None)])
def test_peak_table_covers_blackwell_and_cdna(name, peak):
    from workloads.training.metrics import peak_tflops_for

    assert peak_tflops_for(name) == peak


# ---- #8 which dtype the gradient collectives moved ----

def _grad_bytes_rank(rank: int, tmp: str, engine: str, port: int) -> None:
    import json
    import os

    import torch.distributed as dist
    import yaml as _yaml

    from workloads.core import dist as fdist
    from workloads.models.neox import GPTNeoX, NeoXConfig
    from workloads.training.commtimer import CommTimer
    from workloads.training.engines import TrainSettings, build_engine

    # DeepSpeed reads the launcher's variables, as torchrun sets them
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    conf = Path(__file__).resolve().parent.parent / "conf"
    torch.manual_seed(0)
    model = GPTNeoX(NeoXConfig.from_dict(_yaml.safe_load((conf / "model" / "neox-tiny.yaml").read_text())))
    timer = CommTimer(torch.device("cpu"))
    eng = build_engine(_yaml.safe_load((conf / "parallel" / f"{engine}.yaml").read_text()), model,
                       TrainSettings(2, 1, 1e-3, 0.0, 1.0, "bf16", False), torch.device("cpu"))
    x = torch.randint(0, 1000, (2, 16))
    with timer.active():
        timer.begin_step()
        eng.step([(x, x)])
        timer.end_step()
    if rank == 0:
        Path(tmp, f"{engine}.json").write_text(json.dumps(timer.step_bytes))
    fdist.close()


@pytest.mark.slow
def test_bf16_ddp_moves_fp32_gradients_and_zero_moves_bf16(tmp_path):
    """Two real Gloo ranks per engine, precision bf16: DDP all-reduces fp32 buckets (autocast
    keeps fp32 parameters), DeepSpeed ZeRO-1 reduces bf16 (it casts the model): half the bytes."""
    import json

    import torch.multiprocessing as mp

    from workloads.training.commtimer import comm_dtypes

    seen = {}
    for engine in ("ddp", "zero1"):
        mp.spawn(_grad_bytes_rank, args=(str(tmp_path), engine, free_port()), nprocs=2)
        seen[engine] = json.loads((tmp_path / f"{engine}.json").read_text())
    assert comm_dtypes([seen["ddp"]], 0)["dtype"] == "float32"
    assert comm_dtypes([seen["zero1"]], 0)["dtype"] == "bfloat16"
    assert seen["ddp"]["float32"] == 2 * seen["zero1"]["bfloat16"]


def test_comm_dtypes_worked_values():
    from workloads.training.commtimer import comm_dtypes, payload

    steps = [{"float32": 100}, {"float32": 800, "uint8": 1}, {"float32": 1000, "int64": 8}]
    assert comm_dtypes(steps, 1) == {"bytes_per_step_by_dtype": {"float32": 900.0, "int64": 4.0, "uint8": 0.5},
                                     "dtype": "float32"}
    assert comm_dtypes([], 0) == {"bytes_per_step_by_dtype": {}, "dtype": None}
    a, b = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(8)
    assert payload("all_reduce", (a,), {}) is a and payload("reduce_scatter_tensor", (b, a), {}) is a
    assert payload("all_gather_into_tensor", (), {"output_tensor": b, "input": a}) is a


# ---- #12 containers: the locked-memory limit NCCL's IB transport needs ----

def test_memlock_warning():
    import resource

    from workloads.fabric.preflight import memlock_warning

    assert "ulimit -l unlimited" in memlock_warning(64 * 1024, True)
    assert memlock_warning(64 * 1024, False) is None  # Socket / PCIe fabrics pin nothing
    assert memlock_warning(resource.RLIM_INFINITY, True) is None and memlock_warning(2 << 30, True) is None
