"""One worker node (node_rank > 0) of a multi-node SGLang/vLLM server:

    python -m workloads.inference.worker [hydra overrides, as node 0's launch/infer.py got them]

It composes the same config as node 0 and asks the same adapter for the command, so every
node gets the same engine arguments (server.extra_args, server.env, --served-model-name,
vLLM's --distributed-executor-backend mp) and differs only where the adapter says a worker
differs (--node-rank, --host, vLLM's --headless). It then runs that command under the
fabric profile and NCCL's per-process log, exactly as node 0's orchestrator starts its
engine (launch/slurm/serve_node.sh runs this on nodes > 0), and ends it once node 0's server has
gone (its sweep is over), so that the job ends as the sweep did.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from omegaconf import OmegaConf

from workloads.core import rundir
from workloads.core.errors import UsageError
from workloads.fabric.profile import compose_node, node_env
from workloads.inference.adapters import get_adapter
from workloads.inference.adapters.base import ServerSpec
from workloads.models.tp import check_tp_divides


def worker_command(overrides: list[str]) -> tuple[list[str], dict[str, str | None], str]:
    """(argv, environment to apply on top of this one, node 0's server to watch) for this node's
    engine worker."""
    cfg = compose_node(overrides)
    # the run directory node 0 writes too (FABRICBENCH_RUN_ID, shared by the job's nodes): an
    # adapter that keeps logs there (vllm-pd's decode instance) keeps them where node 0 reads them
    spec = replace(ServerSpec.from_config(OmegaConf.to_container(cfg.server, resolve=True)),
                   run_dir=str(rundir.run_dir(cfg.output_root, cfg.get("run_id"))))
    if spec.node_rank == 0:
        raise UsageError("server.node_rank=0 is the head node: run launch/infer.py there, this only starts workers")
    adapter = get_adapter(spec.adapter)
    if not adapter.starts_process:
        raise UsageError(f"server={spec.adapter} starts no process, so it has no worker nodes")
    model = OmegaConf.to_container(cfg.model, resolve=True)
    check_tp_divides(spec.tp, model)
    adapter.check_available(spec, OmegaConf.to_container(cfg.server, resolve=True))
    fabric, env = node_env(overrides, cfg=cfg)
    launch = adapter.command(spec, model, fabric.name, adapter.forwarded_overrides(overrides))
    if launch.argv is None:
        raise UsageError(f"server={spec.adapter} gave no command to start")
    # the same layering as the orchestrator's: fabric first, the engine's own env on top
    return launch.argv, {**env, **launch.env}, head_url(spec)


MISSES = 5  # probes in a row (1 s apart) that the head's server must miss, once seen up, to be over


def head_url(spec: ServerSpec) -> str:
    """Node 0's server: at the rendezvous host, on server.port (every node composes the same)."""
    return f"http://{spec.dist_init_addr.rsplit(':', 1)[0]}:{spec.port}{spec.health_path}"


def run_watched(env: dict[str, str | None], command: list[str], watch: str, misses: int = MISSES) -> int:
    """Run this node's engine until node 0's server (`watch`), once seen up, stops answering: the
    sweep is over, so the engine is stopped and the node exits 0, and the job ends as its sweep
    did. (srun's --wait, which ends the workers otherwise, SIGKILLs them: exit 137, a failed job.)
    An engine that exits by itself gives its own code, unless node 0's server has gone too (a
    TP worker whose head left ends with an error that is the job's normal end)."""
    import subprocess
    import time

    from workloads.inference.adapters.orchestrator import HeadWatch, probe

    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    try:
        child = subprocess.Popen(command, env=full)
    except OSError as e:
        print(f"error: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
        return 2
    head = HeadWatch(watch, misses)
    try:
        while True:
            code = child.poll()
            if code is not None:
                if head.seen and all(probe(watch) != 200 for _ in range(2)):
                    print(f"fabricbench worker: node 0's server ({watch}) has ended and this node's engine with it "
                          f"(exit code {code})", flush=True)
                    return 0
                return code
            if head.gone():
                print(f"fabricbench worker: node 0's server ({watch}) stopped answering: its sweep is over; "
                      "stopping this node's engine", flush=True)
                child.terminate()
                try:
                    child.wait(5)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                return 0
            time.sleep(1)
    finally:
        if child.poll() is None:
            child.kill()


def main(argv: list[str] | None = None) -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        command, env, watch = worker_command(overrides)
    except (UsageError, HydraException, OmegaConfBaseException) as e:
        print(f"error: {str(e).splitlines()[0]} (overrides: {' '.join(overrides) or 'none'})", file=sys.stderr)
        return 2
    print(f"fabricbench worker (node {os.environ.get('SLURM_NODEID', '?')}): {' '.join(command)}", flush=True)
    return run_watched(env, command, watch)


if __name__ == "__main__":
    raise SystemExit(main())
