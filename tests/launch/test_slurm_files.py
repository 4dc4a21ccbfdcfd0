"""The Slurm batch files and the multi-node serving job without a cluster: Slurm's commands
are shims, engines are stand-ins at the process boundary. Every documented multi-node example
validates. (The real cluster is in test_slurm.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import REPO, SLURM_DIR
from helpers.standins import ENGINE_VARS, stand_in


def test_worker_node_gets_the_fabric_profile_and_nccl_log(tmp_path):
    """serve_node.sh as srun runs it on node 1 of a 2-node SGLang job. The engine needs a GPU,
    so FB_ENGINE_PYTHON is a stand-in that writes the environment it was started with."""
    import json
    import os
    import subprocess
    import sys

    repo = REPO
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


def test_batch_files_give_each_task_its_cpus():
    slurm = REPO / "launch" / "slurm"
    for name in ("train.sbatch", "collectives.sbatch", "inference.sbatch"):
        assert "\n#SBATCH --exclusive\n" in (slurm / name).read_text(), name
    lib = (slurm / "lib.sh").read_text()
    assert "--whole --cpu-bind=none" in lib and "$FB_MODEL_PATH:$FB_MODEL_PATH" in lib


def test_multi_node_serving_job_ends_after_the_sweep():
    """#11: node 0's sweep exits 0 and --kill-on-bad-exit never fires; srun --wait ends the
    engine workers of the other nodes (shown with bash -x: srun is not run)."""
    import subprocess

    slurm = REPO / "launch" / "slurm"
    assert 'FB_SRUN_WAIT="${FB_SRUN_WAIT:-60}"' in (slurm / "inference.sbatch").read_text()
    script = (f'srun() {{ printf "%s\\n" "$@"; }}; source {slurm / "lib.sh"}; SLURM_JOB_NUM_NODES=2 '
              'FB_HOME=/x FB_SRUN_WAIT=60 fb_srun_per_node true')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30).stdout.split()
    assert "--wait=60" in out and "--kill-on-bad-exit=1" in out and "--whole" in out


def _node_env(tmp_path: Path, node: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENGINE_VARS)}
    env.update(FB_MODEL_PATH="/models/m", FB_TP="16", FB_DIST_ADDR="10.0.0.1:29500", SLURM_NODEID=str(node),
               SLURM_JOB_NUM_NODES="2", FB_NODE_ADDRS="10.0.0.1 10.0.0.2", FB_PYTHON=sys.executable,
               FB_HOME=str(REPO), FABRICBENCH_RUN_ID="slurm-42")
    env.update(extra)
    return env


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
    """argv less what the adapters make differ per node: --node-rank, --host, --headless, and the
    API server's own --enable-prompt-tokens-details (node 0 answers the requests; a headless node
    has no API server to report cached prompt tokens)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--node-rank", "--host"):
            skip = True
        elif a not in ("--headless", "--enable-prompt-tokens-details"):
            out.append(a)
    return out


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_worker_node_gets_node_0s_engine_arguments(tmp_path, engine):
    """serve_node.sh as srun runs it on node 1 of a 2-node job, with extra_args, env and a
    served name: the worker's command must equal node 0's except where a worker differs."""
    fake = stand_in(tmp_path / f"{engine}-engine", tmp_path / "seen.json")
    common = [f"output_root={tmp_path / 'results'}", "fabric=roce", "model=llama-3.1-8b", "server.served_model_name=big",
              "+server.env.ENGINE_KNOB=on", *ENGINE_OVERRIDES[engine]]
    pick = f"server.python={fake}" if engine == "sglang" else f"server.executable={fake}"
    env = _node_env(tmp_path, 1, FB_ENGINE=engine, FB_SERVE_PORT="30000")
    r = subprocess.run(["bash", str(SLURM_DIR / "serve_node.sh"), *common, pick], env=env, cwd=tmp_path,
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


def documented_examples() -> list[tuple[str, list[str]]]:
    """Every `sbatch ... launch/slurm/<file>.sbatch ...` command in README.md, the docs/ pages
    (docs/cluster.md holds most) and the batch files' own headers, continuation lines joined,
    as (where, words)."""
    import shlex

    found = []
    sources = [(REPO / "README.md", False)] + [(p, False) for p in sorted((REPO / "docs").glob("*.md"))] + \
        [(p, True) for p in sorted(SLURM_DIR.glob("*.sbatch"))]
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
                found.append((f"{path.name}: {ln.strip()}", shlex.split(ln.strip(), comments=True)))  # as a shell reads it
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
    from workloads import CONF_DIR, session
    from workloads.core import config
    from workloads.fabric.profile import FabricProfile

    _shims(tmp_path / "bin")
    seen = tmp_path / "seen.json"
    engine = str(stand_in(tmp_path / "stand-in", seen))
    gpus = next((w.split("=")[1] for w in words if w.startswith("--gpus-per-node=")), None)
    assert gpus, f"{where}: no --gpus-per-node, so lib.sh runs 1 rank per node (FB_NPROC_PER_NODE=1)"
    if "inference.sbatch" in where:
        # node 1 runs the worker, which validates as node 0 does, then starts the engine
        r = _submit(tmp_path, words, 1, {"FB_ENGINE_PYTHON": engine, "FB_ENGINE_VLLM": engine,
                                         "FB_CLIENT_PYTHON": sys.executable})
        argv = json.loads(seen.read_text())["argv"] if seen.exists() else []
        if "FB_ENGINE=vllm-pd" in words:
            # node 1 starts the decode instance (the stand-in, which exits: serve.py then says so,
            # exit 1, a fault) at each node's TP (8 GPUs) on FB_SERVE_PORT + 1, no TP group across the nodes
            assert r.returncode == 1 and "the decode instance exited" in r.stdout + r.stderr, f"{where}: {r.stderr[-1500:]}"
            assert argv[argv.index("--tensor-parallel-size") + 1] == "8" and argv[argv.index("--port") + 1] == "8001"
            assert "--node-rank" not in argv
            _srun_gets_whole_nodes(tmp_path, words, wait=True)
            return
        assert r.returncode == 0, f"{where}: {r.stderr[-1500:]}"
        tp = argv[argv.index("--tp-size" if "--tp-size" in argv else "--tensor-parallel-size") + 1]
        assert tp == "16" and argv[argv.index("--node-rank") + 1] == "1"
        _srun_gets_whole_nodes(tmp_path, words, wait=True)
        return
    r = _submit(tmp_path, words, 0, {"FB_PYTHON": engine, "FB_CLIENT_PYTHON": engine})
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
    cfg = config.compose(CONF_DIR, [*workload, *overrides, f"output_root={tmp_path / 'results'}"])
    config.validate_job(cfg, nproc * nnodes)


_HEAD = ("import http.server, sys\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        open(sys.argv[2], 'a').write('.'); self.send_response(200); self.end_headers()\n"
         "    def log_message(self, *a): pass\n"
         "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


@pytest.mark.parametrize("engine_exits", [False, True])
def test_a_worker_ends_with_node_0s_server(tmp_path, engine_exits):
    """A worker node's engine runs until node 0's server, once seen up, is gone: the worker then
    stops it (or it has ended by itself, as a TP worker whose head left does) and exits 0, so the
    job ends COMPLETED rather than SIGKILLed by srun --wait (exit 137). Real processes: node 0's
    server is a stand-in HTTP server, the engine a stand-in that sleeps (or exits 3 once the
    head is gone)."""
    import socket
    import subprocess
    import sys
    import threading
    import time

    from workloads.core.ports import free_port
    from workloads.inference.worker import run_watched

    port, probed = free_port(), tmp_path / "probed"
    head = subprocess.Popen([sys.executable, "-c", _HEAD, str(port), str(probed)])
    watch = f"http://127.0.0.1:{port}/health"
    # the exiting engine checks its head by connecting (no GET: the head counts only the worker's probes)
    engine = ("import socket, sys, time\n"
              "while True:\n"
              "    time.sleep(0.5)\n"
              f"    try: socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
              "    except OSError: sys.exit(3)\n") if engine_exits else "import time; time.sleep(600)"
    pid = tmp_path / "engine.pid"
    command = [sys.executable, "-c", f"import os; open({str(pid)!r}, 'w').write(str(os.getpid()))\n" + engine, watch]

    def end_head():
        deadline = time.monotonic() + 60
        while not probed.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        head.kill()

    # The case is a head that was up and then went. Its stand-in takes a Python start to bind,
    # which under the suite's load once took longer than the exiting engine's first check
    # (0.5 s): the engine exited 3 before the head was ever seen, and the worker rightly gave
    # that code (run 21). So the head listens before the worker starts; a connect, not a GET,
    # since the head counts GETs as the worker's probes.
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert head.poll() is None and time.monotonic() < deadline, "the stand-in head never listened"
            time.sleep(0.05)
    threading.Thread(target=end_head, daemon=True).start()
    try:
        assert run_watched({}, command, watch, misses=3) == 0
    finally:
        head.kill()
    engine_pid = int(pid.read_text())
    assert not Path(f"/proc/{engine_pid}").exists() or "zombie" in Path(f"/proc/{engine_pid}/status").read_text()


def test_a_worker_whose_engine_fails_while_node_0_serves_gives_its_code(tmp_path):
    import subprocess
    import sys

    from workloads.core.ports import free_port
    from workloads.inference.worker import run_watched

    port = free_port()
    head = subprocess.Popen([sys.executable, "-c", _HEAD, str(port), str(tmp_path / "probed")])
    try:
        code = run_watched({}, [sys.executable, "-c", "import time, sys; time.sleep(2); sys.exit(5)"],
                           f"http://127.0.0.1:{port}/health")
    finally:
        head.kill()
    assert code == 5


def test_oci_task_env_hands_the_tasks_slurm_variables_to_oci_run(tmp_path):
    """`srun --container` on Slurm 22.05 (docs/cluster.md): the task prolog saves the task's Slurm
    variables (NUL-separated, a value may hold a newline) where oci_run.sh, run next with Slurm's
    %j %s %n %t, looks; oci_run.sh without them, or with the wrong arguments, is one line."""
    task = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_ODD": "a\nb"}
    env = {"PATH": os.environ["PATH"], "FB_OCI_TASK_ENV_DIR": str(tmp_path), "NOT_SLURM": "x", **task}
    p = subprocess.run(["sh", str(SLURM_DIR / "oci_task_env.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout == "", (p.stdout, p.stderr)  # slurmstepd reads a prolog's stdout
    (saved,) = (tmp_path / f"fabricbench-oci-{os.getuid()}").iterdir()
    assert saved.name == "7.0.n2.0.env"
    got = dict(kv.split("=", 1) for kv in saved.read_text().split("\0") if kv)
    assert got == task
    run = ["sh", str(SLURM_DIR / "oci_run.sh"), str(tmp_path / "runc"), "n1.root.7.0.0", str(tmp_path), "7", "0", "n1", "0"]
    p = subprocess.run(run, env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "7.0.n1.0.env is missing" in p.stderr, p.stderr
    assert "srun --task-prolog=<checkout>/launch/slurm/oci_task_env.sh" in p.stderr
    p = subprocess.run(run[:-1], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "oci_run.sh takes 7 arguments" in p.stderr, p.stderr
