"""The second review of the GPU code paths (../shared/reviews/gpu-path-2.md): its new findings
N2..N8, its gpu-check risks and the call sites it found untested, one or more tests each,
written to fail on the code before its fix. Nothing here needs a GPU: NCCL/RCCL logs are
fixtures written from their format strings (each file's header names the source line),
engines are stand-ins at the process boundary, Slurm's commands are shims, and torch.cuda is
the boundary where a CUDA call is made. N1 (the external nccl-tests split) is in
test_gpu_path.py beside #6; gpu-check's table and bands are in test_gpu_check.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import REPO

SLURM = REPO / "launch" / "slurm"
ENGINE_VARS = ("NCCL_", "SLURM_", "FB_", "FABRICBENCH_")


def _stand_in(path: Path, seen: Path) -> Path:
    """An engine (it needs a GPU) replaced at the process boundary: it records the argv and
    environment it was started with."""
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'env': dict(os.environ), 'argv': sys.argv}}, open({str(seen)!r}, 'w'))\n")
    path.chmod(0o755)
    return path


def _engine_python_without_hydra(bindir: Path) -> None:
    """`python3`/`python` as in the sglang/vllm images: the engine's interpreter, without
    fabricbench's dependencies (-S: no site-packages, so no hydra)."""
    bindir.mkdir(exist_ok=True)
    for name in ("python3", "python"):
        (bindir / name).write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
        (bindir / name).chmod(0o755)


def _node_env(tmp_path: Path, node: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENGINE_VARS)}
    env.update(FB_MODEL_PATH="/models/m", FB_TP="16", FB_DIST_ADDR="10.0.0.1:29500", SLURM_NODEID=str(node),
               SLURM_JOB_NUM_NODES="2", FB_NODE_ADDRS="10.0.0.1 10.0.0.2", FB_PYTHON=sys.executable,
               FB_HOME=str(REPO), FABRICBENCH_RUN_ID="slurm-42")
    env.update(extra)
    return env


# ---- N5: worker nodes start the engine with node 0's arguments ----

ENGINE_OVERRIDES = {
    "sglang": ["server.extra_args=[--mem-fraction-static,'0.85',--enable-torch-compile]"],
    "vllm": ["server.extra_args=[--max-model-len,'8192',--enforce-eager]"],
}


def _head_argv(engine: str, overrides: list[str]) -> list[str]:
    """Node 0's engine command, from the adapter launch/infer.py uses."""
    from workloads.fabric.profile import compose_node
    from workloads.inference.adapters import get_adapter
    from workloads.inference.adapters.base import ServerSpec

    cfg = compose_node(overrides)
    spec = ServerSpec.from_config(OmegaConf.to_container(cfg.server, resolve=True))
    return get_adapter(engine).command(spec, OmegaConf.to_container(cfg.model, resolve=True)).argv


def _without_node_fields(argv: list[str]) -> list[str]:
    """argv less what the adapters make differ per node: --node-rank, --host, --headless."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--node-rank", "--host"):
            skip = True
        elif a != "--headless":
            out.append(a)
    return out


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_worker_node_gets_node_0s_engine_arguments(tmp_path, engine):
    """serve_node.sh as srun runs it on node 1 of a 2-node job, with extra_args, env and a
    served name: the worker's command must equal node 0's except where a worker differs."""
    fake = _stand_in(tmp_path / f"{engine}-engine", tmp_path / "seen.json")
    common = [f"output_root={tmp_path / 'results'}", "fabric=roce", "model=llama-3.1-8b", "server.served_model_name=big",
              "+server.env.ENGINE_KNOB=on", *ENGINE_OVERRIDES[engine]]
    pick = f"server.python={fake}" if engine == "sglang" else f"server.executable={fake}"
    env = _node_env(tmp_path, 1, FB_ENGINE=engine, FB_SERVE_PORT="30000")
    r = subprocess.run(["bash", str(SLURM / "serve_node.sh"), *common, pick], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    node0 = [f"server={engine}", "server.tp=16", "server.nnodes=2", "server.node_rank=0",
             "server.dist_init_addr=10.0.0.1:29500", "server.host=10.0.0.1", "server.port=30000",
             "server.model_path=/models/m", *common, pick]
    head = _head_argv(engine, node0)
    worker = seen["argv"]
    worker[0] = str(fake)  # the stand-in sees its own path as argv[0]
    assert _without_node_fields(worker) == _without_node_fields(head)
    assert worker[worker.index("--node-rank") + 1] == "1" and worker[worker.index("--host") + 1] == "10.0.0.2"
    assert "--served-model-name" in worker and worker[-1] in ("--enable-torch-compile", "--enforce-eager")
    if engine == "vllm":
        assert "--headless" in worker and worker[worker.index("--distributed-executor-backend") + 1] == "mp"
        assert seen["env"]["SPT_NOENV"] == "1"
    # server.env and the fabric profile, with NCCL's log under the job's run directory
    e = seen["env"]
    assert e["ENGINE_KNOB"] == "on" and e["NCCL_IB_GID_INDEX"] == "3"
    assert e["NCCL_DEBUG_FILE"] == str(tmp_path / "results" / "slurm-42" / "nccl" / "nccl.%h.%p.log")


def test_worker_refuses_the_head_node_and_bad_overrides_in_one_line():
    from workloads.inference.worker import main

    env = {k: v for k, v in os.environ.items() if not k.startswith(ENGINE_VARS)}
    r = subprocess.run([sys.executable, "-m", "workloads.inference.worker", "server=sglang", "server.node_rank=0"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "node_rank=0 is the head node" in r.stderr
    assert main(["server=nonesuch"]) == 2


# ---- N4: serving images run fabricbench in its venv, not in the engine's python3 ----

def _image_env(stage: str) -> dict[str, str]:
    from tests.test_dockerfile import stages

    text = stages((REPO / "Dockerfile").read_text())[stage]
    out = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            out.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    return out


def _image_cmd(stage: str) -> list[str]:
    from tests.test_dockerfile import stages

    cmds = re.findall(r"^CMD (\[.*\])$", stages((REPO / "Dockerfile").read_text())[stage], re.M)
    return json.loads(cmds[-1])


def _workdir(stage: str) -> str:
    from tests.test_dockerfile import stages

    return re.findall(r"^WORKDIR (\S+)$", stages((REPO / "Dockerfile").read_text())[stage], re.M)[-1]


@pytest.mark.parametrize("stage", ["sglang", "vllm"])
def test_serving_image_commands_run_in_fabricbench_venv(tmp_path, stage):
    """The image laid out here: `python3` is the engine's interpreter (no hydra), and the
    image's FB_CLIENT_PYTHON, the venv `uv sync` makes in its WORKDIR, is this checkout's
    .venv. The image's CMD and the Slurm path (lib.sh's FB_PYTHON inside a container) must
    both reach hydra and fabricbench."""
    _engine_python_without_hydra(tmp_path / "bin")
    image = _image_env(stage)
    venv_python = f"{_workdir(stage)}/.venv/bin/python"
    assert image["FB_CLIENT_PYTHON"] == venv_python
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENGINE_VARS)}
    env.update(PATH=f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}", FB_CLIENT_PYTHON=sys.executable)
    no_hydra = subprocess.run(["python3", "-c", "import hydra"], env=env, capture_output=True, timeout=60)
    assert no_hydra.returncode != 0  # the stand-in really is the engine's interpreter
    cmd = [sys.executable if a == venv_python else a for a in _image_cmd(stage)]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "server" in r.stdout, r.stderr[-2000:]
    # the batch files: lib.sh in container mode, then what serve_node.sh / torchrun_node.sh run
    (tmp_path / "bin" / "scontrol").write_text(
        '#!/bin/sh\n[ "$2" = hostnames ] && echo "n1 n2" && exit 0\necho "NodeName=$3 NodeAddr=10.0.0.$3"\n')
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    script = (f'source {SLURM / "lib.sh"} && fb_setup >/dev/null && "$FB_PYTHON" -c '
              '"import hydra, workloads.inference.worker, sys; print(sys.executable)"')
    r = subprocess.run(["bash", "-c", script], env=env | {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2",
                                                            "SLURM_JOB_NODELIST": "n[1-2]", "FB_HOME": str(REPO),
                                                            "FB_CONTAINER_IMAGE": f"fabricbench+{stage}.sqsh"},
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == sys.executable


# ---- N7: every documented multi-node example validates ----

def documented_examples() -> list[tuple[str, list[str]]]:
    """Every `sbatch ... launch/slurm/<file>.sbatch ...` command in README.md and in the
    batch files' own headers, continuation lines joined, as (where, words)."""
    import shlex

    found = []
    sources = [(REPO / "README.md", False)] + [(p, True) for p in sorted(SLURM.glob("*.sbatch"))]
    for path, header_only in sources:
        lines = path.read_text().splitlines()
        if header_only:  # the comment block after the shebang, before #SBATCH
            lines = [ln.lstrip("#").strip() for ln in lines[1:] if ln.startswith("#") and not ln.startswith("#SBATCH")]
        logical, pending = [], ""
        for ln in lines:
            if ln.rstrip().endswith("\\"):
                pending += ln.rstrip()[:-1] + " "
            else:
                logical.append(pending + ln)
                pending = ""
        for ln in logical:
            if re.search(r"\bsbatch\b[^`]*launch/slurm/\w+\.sbatch", ln):
                found.append((f"{path.name}: {ln.strip()}", shlex.split(ln.strip())))
    return found


def _shims(bindir: Path) -> None:
    """scontrol (two nodes' addresses), srun (runs the step as node FAKE_NODEID, through
    `apptainer exec ... <image>` when that is the step), all at the Slurm boundary."""
    bindir.mkdir(exist_ok=True)
    shims = {
        "scontrol": '[ "$2" = hostnames ] && { seq -f "n%g" 1 "$SLURM_JOB_NUM_NODES" | tr "\\n" " "; exit 0; }\n'
                    'echo "NodeName=$3 NodeAddr=10.0.0.${3#n}"\n',
        "srun": 'printf "%s\\n" "$@" > "$FAKE_SRUN_ARGV"\n'
                'while [ "${1#--}" != "$1" ]; do shift; done\n'
                'if [ "$1" = apptainer ]; then shift 2\n'
                '  while [ "${1#--}" != "$1" ]; do [ "$1" = --nv ] && shift || shift 2; done; shift; fi\n'
                'export SLURM_NODEID="$FAKE_NODEID"\nexec "$@"\n',
    }
    for name, body in shims.items():
        (bindir / name).write_text("#!/bin/bash\n" + body)
        (bindir / name).chmod(0o755)


def _submit(tmp_path: Path, words: list[str], node: int, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the example's batch file as sbatch would on a 2..N node allocation: its env
    assignments, --nodes and --gpus-per-node become Slurm's variables."""
    env_words = [w for w in words[:words.index("sbatch")] if "=" in w]
    rest = words[words.index("sbatch") + 1:]
    opts = {k: v for k, _, v in (w[2:].partition("=") for w in rest if w.startswith("--"))}
    batch = next(w for w in rest if w.endswith(".sbatch"))
    overrides = rest[rest.index(batch) + 1:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENGINE_VARS)}
    env.update(dict(w.split("=", 1) for w in env_words))
    env.update(SLURM_JOB_ID="42", SLURM_JOB_NUM_NODES=opts.get("nodes", "2"), SLURM_JOB_NODELIST="n[1-2]",
               SLURM_SUBMIT_DIR=str(REPO), FB_HOME=str(REPO), FAKE_NODEID=str(node),
               FAKE_SRUN_ARGV=str(tmp_path / "srun.argv"),
               PATH=f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}", **extra_env)
    if "gpus-per-node" in opts:
        env["SLURM_GPUS_ON_NODE"] = opts["gpus-per-node"]
    return subprocess.run(["bash", str(REPO / batch), *overrides], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)


def _srun_gets_whole_nodes(tmp_path: Path, words: list[str], wait: bool) -> None:
    """What the step asked srun for (review #5, #11): one task per node holding every CPU of
    the node, unbound; the serving job ends its workers after node 0's sweep; a container
    example runs in its image."""
    argv = (tmp_path / "srun.argv").read_text().split("\n")
    assert {"--whole", "--cpu-bind=none", "--ntasks-per-node=1", "--kill-on-bad-exit=1"} <= set(argv), argv
    assert ("--wait=60" in argv) == wait
    image = next((w.split("=", 1)[1] for w in words if w.startswith(("FB_CONTAINER_IMAGE=", "FB_APPTAINER_IMAGE="))), None)
    if image and image.endswith(".sqsh"):
        assert f"--container-image={image}" in argv
    elif image:
        assert argv[argv.index("apptainer"):argv.index("apptainer") + 3] == ["apptainer", "exec", "--nv"] and image in argv


EXAMPLES = documented_examples()


def test_the_docs_have_multi_node_examples_of_every_batch_file():
    files = {re.search(r"launch/slurm/(\w+)\.sbatch", where).group(1) for where, _ in EXAMPLES}
    assert files == {"train", "collectives", "inference"} and len(EXAMPLES) >= 8


@pytest.mark.parametrize("where, words", EXAMPLES, ids=[w[:60] for w, _ in EXAMPLES])
def test_documented_multi_node_example_validates(tmp_path, monkeypatch, where, words):
    """Each example runs its batch file under Slurm shims up to the engine or torchrun (which
    need GPUs: stand-ins record what they were given), then the job's own validation runs on
    what reached them: the composed config, the TP degree against the model, the ranks."""
    from workloads.core import launcher, session
    from workloads.fabric.profile import FabricProfile

    _shims(tmp_path / "bin")
    seen = tmp_path / "seen.json"
    stand_in = str(_stand_in(tmp_path / "stand-in", seen))
    gpus = next((w.split("=")[1] for w in words if w.startswith("--gpus-per-node=")), None)
    assert gpus, f"{where}: no --gpus-per-node, so lib.sh runs 1 rank per node (FB_NPROC_PER_NODE=1)"
    if "inference.sbatch" in where:
        # node 1 runs the worker, which validates as node 0 does, then starts the engine
        r = _submit(tmp_path, words, 1, {"FB_ENGINE_PYTHON": stand_in, "FB_ENGINE_VLLM": stand_in,
                                         "FB_CLIENT_PYTHON": sys.executable})
        assert r.returncode == 0, f"{where}: {r.stderr[-1500:]}"
        argv = json.loads(seen.read_text())["argv"]
        tp = argv[argv.index("--tp-size" if "--tp-size" in argv else "--tensor-parallel-size") + 1]
        assert tp == "16" and argv[argv.index("--node-rank") + 1] == "1"
        _srun_gets_whole_nodes(tmp_path, words, wait=True)
        return
    r = _submit(tmp_path, words, 0, {"FB_PYTHON": stand_in, "FB_CLIENT_PYTHON": stand_in})
    assert r.returncode == 0, f"{where}: {r.stderr[-1500:]}"
    _srun_gets_whole_nodes(tmp_path, words, wait=False)
    argv = json.loads(seen.read_text())["argv"]
    nproc = int(next(a for a in argv if a.startswith("--nproc_per_node=")).split("=")[1])
    nnodes = int(next(a for a in argv if a.startswith("--nnodes=")).split("=")[1])
    script = next(a for a in argv if a.endswith(".py") and "/launch/" in a)
    overrides = argv[argv.index(script) + 1:]
    assert nproc == int(gpus)
    # the workload's own checks for that world size; this machine's HCAs and GPUs are not the example's
    monkeypatch.setattr(session, "preflight", lambda fabric: None)
    monkeypatch.setattr(FabricProfile, "check_backend_usable", lambda self: None)
    workload = [] if script.endswith("train.py") else ["workload=collectives"]
    cfg = launcher.compose(launcher.CONF_DIR, [*workload, *overrides, f"output_root={tmp_path / 'results'}"])
    launcher.validate_job(cfg, nproc * nnodes)


# ---- N2 / N3: fabric=pcie on an XGMI box and on NVLink-bridged pairs ----

LOGS = Path(__file__).parent / "fixtures" / "nccl_logs"


def _pcie_verdict(case: str) -> dict:
    from tests.test_gpu_path import evidence, profile
    from workloads.fabric import verify

    return verify.decide(profile("pcie"), evidence(case), environ={})


def test_pcie_label_rejects_an_xgmi_box():
    """RCCL names the NVLink path type XGMI (rccl src/graph/topo.cc:27) and P2P/IPC reads the
    same over XGMI and PCIe: the fixture passed fabric=pcie before XGMI was forbidden."""
    from workloads.fabric import nccl_log

    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "rccl_2.21_xgmi"))
    assert (s["library"], s["version"]) == ("RCCL", "2.21.5-0cbce2a7")  # "RCCL version : x" (init.cc:719)
    assert s["graph_types"] == ["XGMI"] and s["gpu_links"] == ["XGMI"] and s["channels"] == {"P2P/IPC": 8}
    d = _pcie_verdict("rccl_2.21_xgmi")
    assert d["verdict"] == "mismatch" and "XGMI" in d["message"]


def test_pcie_label_rejects_nvlink_bridged_pairs_that_the_graph_line_hides():
    """NCCL 2.30.7, H100 NVL bridged in pairs: the ring's GRAPH type is its worst hop (PXB), so
    only the topology dump's `+ NVL[..] - DEV/..` links show the NVLink hops."""
    from workloads.fabric import nccl_log

    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_2.30_nvlink_bridged"))
    assert s["graph_types"] == ["PXB"] and s["gpu_links"] == ["NVL"]
    assert s["gpu_pci(GB/s)"] == 24.0  # "+ PCI[24.0] - DEV/..": gen4 x16 as NCCL rates it (the PCIe ceiling)
    d = _pcie_verdict("nccl_2.30_nvlink_bridged")
    assert d["verdict"] == "mismatch" and "NVL links between GPUs" in d["message"]
    # a true PCIe box (no GPU links in its dump) still passes; LOC/PCI links are not GPU fabric
    assert _pcie_verdict("nccl_pcie")["verdict"] == "ok"
    lg = nccl_log.parse_text("h:1:2 [0] NCCL INFO   + LOC[5000.0] - GPU/0-180000\n"
                             "h:1:2 [0] NCCL INFO + PCI[24.0] - GPU/0-18000 (0)\n")
    assert lg.gpu_links == []


# ---- N6: % of line rate over the NICs the channels used, not every NIC NCCL listed ----

def test_line_rate_counts_only_the_ports_the_channels_used():
    from tests.test_gpu_path import evidence, profile
    from workloads.fabric import linerate, nccl_log, nic, verify

    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_2.30_idle_ports"))
    assert [d["name"] for d in s["devices_listed"]] == ["mlx5_0", "mlx5_1", "mlx5_4"]
    assert [d["name"] for d in s["devices"]] == ["mlx5_0"]
    transport = verify.decide(profile("ib"), evidence("nccl_2.30_idle_ports"), environ={})
    assert transport["verdict"] == "ok"
    rails = nic.rails_for(profile("ib"), {}, transport)
    assert rails == ["rdma:mlx5_0:1"]
    # the per-rank bound busbw is compared with: one 200 Gb/s port, not three ports' worth
    rate = linerate.node_line_rate(rails, root=Path(__file__).parent / "fixtures" / "sysfs" / "ib_host")
    assert rate["bits_per_s"] == 200e9 and rate["unknown_rails"] == []
    assert linerate.job_line_rate([rate, rate], 1)["per_rank(GB/s)"] == 25.0


def test_a_channel_on_a_merged_virtual_nic_keeps_every_listed_port():
    """A virtual NIC (NCCL_IB_MERGE_NICS) is numbered after the listed ports: its index names
    no listed device, so nothing is dropped on a guess."""
    from workloads.fabric import nccl_log

    lg = nccl_log.parse_text("h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB; OOB ib0:10.0.0.1<0>\n"
                             "h:1:2 [0] NCCL INFO Using network IB\n"
                             "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/2/GDRDMA\n")
    assert lg.net_devs_used == [2] and [d["name"] for d in lg.used_devices] == ["mlx5_0", "mlx5_1"]


# ---- N8: a server's verdict names NCCL's ranks, not the log files' order ----

def test_server_verdict_names_the_rank_that_went_wrong(tmp_path):
    """Two TP ranks of a server on two hosts; the logs sort by host name (a-node before
    b-node) while rank 1 lives on a-node and fell back to sockets: the message must say
    rank 1, which is what an operator looks for in that rank's log."""
    from tests.test_gpu_path import profile
    from workloads.fabric import verify

    logs = tmp_path / "nccl"
    logs.mkdir()
    for host, rank, via, net in (("a-node", 1, "NET/Socket/0", "Socket"), ("b-node", 0, "NET/IB/0/GDRDMA", "IB")):
        p = f"{host}:900:950 [0] NCCL INFO "
        (logs / f"nccl.{host}.900.log").write_text("\n".join([
            p + "NCCL version 2.21.5+cuda12.4",
            p + "NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>",
            p + f"Using network {net}",
            p + f"comm 0x55d1 rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0x4 - Init COMPLETE",
            p + f"Channel 00/0 : {rank}[0] -> {1 - rank}[0] [send] via {via}", ""]))
    d = verify.server_transport(profile("roce"), tmp_path, ranks=2)
    assert d["verdict"] == "mismatch"
    assert "rank 1 used NET/Socket" in d["message"] and "rank 0" not in d["message"], d["message"]
    assert [r["rank"] for r in d["summary"]["ranks"]] == [0, 1]


# ---- gpu-check: figures against the formula and bands, on a record a real run wrote ----

@pytest.mark.slow
def test_tflops_and_mfu_checks_recompute_a_real_records_figures(tmp_path):
    """A one-rank CPU run (a GPU would only change the numbers): gpu-check's TFLOPS/GPU and
    MFU checks recompute the record's figures from its raw step times and shape and agree."""
    from conftest import run_entry, records_in
    from workloads.training.expected import mfu_check, tflops_check

    r = run_entry("train.py", "launcher.nproc_per_node=1", "train.steps=4", "train.warmup_steps=1",
                  "metrics.peak_tflops=1", f"output_root={tmp_path}", "run_id=t", timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = records_in(tmp_path)
    result, expected, ok, _ = tflops_check(rec)
    assert ok is True, (result, expected)
    result, expected, ok, _ = mfu_check(rec)
    assert ok is None and expected == "no band for this model", (result, expected)  # consistent; neox-tiny has no band
    # the same record with its reported TFLOPS off by the world size (2 ranks' worth) fails
    bad = rec | {"metrics": rec["metrics"] | {"tflops_per_gpu": rec["metrics"]["tflops_per_gpu"] / 2}}
    assert tflops_check(bad)[2] is False


def test_nccl_fabric_on_an_old_driver_names_the_driver(tmp_path, monkeypatch):
    """Review #9/gpu-check risk 1: every workload's backend check, not only gpu-check."""
    import torch

    from tests.test_gpu_path import profile
    from workloads.core.errors import UsageError

    if torch.cuda.is_available() or not (torch.version.cuda or "").startswith("13"):
        pytest.skip("needs this lock's CUDA 13 torch on a machine where it sees no GPU")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 550.163.01\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(UsageError, match=r"torch sees no GPU: the NVIDIA driver is 550.163.01, older than the R580"):
        profile("intranode").check_backend_usable()


# ---- gpu-check risk 7: the external binary's NCCL log stays out of our run's nccl/ folder ----

def test_external_binary_logs_beside_its_output_not_in_our_nccl_folder(tmp_path, monkeypatch):
    """Its tuning lines in <run dir>/nccl would be read as the algorithms behind OUR rows
    (linerate.algorithms_in). The stand-in binary (it needs a GPU) writes where NCCL would."""
    from tests.test_collectives_bw import _settings
    from workloads.collectives import nccltests

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "all_reduce_perf"
    fake.write_text('#!/bin/sh\n[ "$1" = "-h" ] && exit 0\n'
                    'echo "NCCL INFO AllReduce: opCount 0 bytes 1048576 datatype 7 op 0 algorithm 1 protocol 2" '
                    '> "$(echo "$NCCL_DEBUG_FILE" | sed "s/%h/h/; s/%p/1/")"\n'
                    f'{sys.executable} {Path(__file__).parent / "nccl_tests_emulator.py"} perf "$@"\n')
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "nccl").mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(run_dir / "nccl" / "nccl.%h.%p.log"))
    monkeypatch.setenv("FAKE_NCCL_TESTS_ARGV", str(bindir / "argv"))
    block = nccltests.run_external(_settings("collectives.minbytes=1M", "collectives.maxbytes=2M"),
                                   run_dir / "external", 1)
    assert block["status"] == "ok" and block["nccl_log"] == str(run_dir / "external" / "nccl.%h.%p.log")
    assert list((run_dir / "nccl").iterdir()) == [] and (run_dir / "external" / "nccl.h.1.log").exists()


# ---- the net plugin: recorded with its API version and library, and held to the profile ----

def test_net_plugin_is_recorded_and_a_profile_can_pin_it():
    from tests.test_gpu_path import evidence, profile
    from workloads.fabric import nccl_log, verify

    s = nccl_log.summarize(nccl_log.parse_dir(LOGS / "nccl_ib_plugin"))
    assert (s["plugin"], s["plugin_api"]) == ("NCCL RDMA Plugin v8", 8)
    assert s["plugin_path"] == "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"
    # 2.30.7's wording (plugin/net.cc:126)
    lg = nccl_log.parse_text("h:1:2 [0] NCCL INFO Successfully loaded external network plugin /usr/lib/libnccl-net-ofi.so\n"
                             "h:1:2 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)\n")
    assert (lg.plugin, lg.plugin_api, lg.plugin_path) == ("Libfabric", 10, "/usr/lib/libnccl-net-ofi.so")
    assert verify.decide(profile("ib"), evidence("nccl_ib_plugin"), environ={})["verdict"] == "ok"  # not pinned
    d = verify.decide(profile("ib", plugin="none"), evidence("nccl_ib_plugin"), environ={})
    assert d["verdict"] == "mismatch"
    assert "loaded net plugin 'NCCL RDMA Plugin v8' from /opt/hpcx/" in d["message"] and "expected plugin: none" in d["message"]
    assert verify.decide(profile("ib", plugin="RDMA Plugin"), evidence("nccl_ib_plugin"), environ={})["verdict"] == "ok"
    d = verify.decide(profile("roce", plugin="spcx"), evidence("nccl_roce"), environ={})
    assert d["verdict"] == "mismatch" and "loaded no net plugin" in d["message"]


@pytest.mark.slow
def test_collectives_record_carries_its_class_ceiling(tmp_path):
    """Issue 27 item 2 in a real run: the record says which ceiling applies and why (here,
    two Gloo ranks on one host: none), and the table prints it."""
    from conftest import run_entry, records_in

    r = run_entry("collectives.py", f"output_root={tmp_path}", "launcher.nproc_per_node=2", "collectives.minbytes=1K",
                  "collectives.maxbytes=4K", "collectives.iters=2", "collectives.warmup_iters=1",
                  "collectives.sample_iters=0", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = records_in(tmp_path)
    assert rec["ceiling"] == {"line(GB/s)": None, "band(GB/s)": [None, None],
                              "source": "Gloo on one host: memory copies, no link class"}
    assert "peak_busbw(%ceiling)" not in rec["metrics"]
    assert "# Class ceiling        : n/a (Gloo on one host" in r.stdout


def test_ceiling_across_nodes_is_the_line_rate_of_the_rails_used():
    from workloads.fabric.ceiling import all_reduce_ceiling

    rec = {"world": {"world_size": 4, "nodes": 2}, "line_rate": {"per_rank(GB/s)": 0.0125},
           "fabric": {"transport": {"summary": {"backend": "gloo"}}}}
    c = all_reduce_ceiling(rec)
    assert c.line_gbps == 0.0125 and "rails the channels used" in c.source


# ---- review 2: the collectives warm-up before the transport check had no test ----

def test_collectives_read_their_transport_only_after_real_collectives(tmp_path, monkeypatch):
    """collectives/run.py's _measure on a real one-rank Gloo group: when it reads the
    transport, all_reduces of a tiny and a multi-MB buffer have already run on the measured
    communicator (NCCL >= 2.22 connects channels at first use; before that its log holds no
    Channel line). The spy stands where NCCL's log would be read."""
    import torch
    import torch.distributed as dist

    from tests.test_collectives_bw import _settings
    from tests.test_gpu_path import profile
    from workloads.collectives import run
    from workloads.core.dist import DistInfo
    from workloads.fabric import verify

    sizes: list[int] = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, **kw: (sizes.append(t.numel()), real(t, **kw))[1])
    seen_at_check: list[list[int]] = []

    class Checked(Exception):
        pass

    def spy(fabric, run_dir, info):
        seen_at_check.append(list(sizes))
        raise Checked  # what comes after is the sweep, tested elsewhere

    monkeypatch.setattr(verify, "check_transport", spy)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        info = DistInfo(0, 1, 0, 1, "gloo", torch.device("cpu"))
        record = {"collectives": {}, "fabric": {}}
        with pytest.raises(Checked):
            run._measure(_settings("collectives.minbytes=1K", "collectives.maxbytes=2K", world=1), profile("loopback"),
                         info, tmp_path, record, 1, None)
    finally:
        dist.destroy_process_group()
    assert seen_at_check == [[1, 1 << 20]]


# ---- review 2: init_once's set_device call (review #13) had no test ----

@pytest.mark.parametrize("visible, index", [(1, 0), (8, 3)])
def test_init_once_binds_the_visible_gpu_of_a_per_task_binding(monkeypatch, visible, index):
    """init_once itself for local rank 3 of 4, with torch.cuda and init_process_group as the
    boundary (no GPU here): under srun --gpus-per-task=1 the one visible GPU is cuda:0."""
    import torch
    import torch.distributed as dist

    from workloads.core import dist as fdist

    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    bound, init = [], {}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: bound.append(i))
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: init.update(kw))
    monkeypatch.setattr(fdist, "_INFO", None)
    monkeypatch.setattr(fdist, "_FABRIC", None)
    monkeypatch.setattr(fdist.atexit, "register", lambda fn: None)
    info = fdist.init_once("nccl", "ib", 60)
    assert bound == [index] and info.device == torch.device("cuda", index) == init["device_id"]
    assert (init["rank"], init["world_size"], info.local_rank) == (3, 4, 3)
