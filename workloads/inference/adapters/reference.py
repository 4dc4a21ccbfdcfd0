"""The built-in reference engine (workloads/inference/engine/, launch/serve.py): tensor-parallel
GPT-NeoX over torch.distributed, started with torchrun from the repository root."""

from __future__ import annotations

import sys
from pathlib import Path

from workloads import REPO_ROOT
from workloads.core.config import hydra_value
from workloads.core.errors import UsageError
from workloads.fabric.netns import emulated_nodes
from workloads.inference.adapters.base import Launch, ServerSpec, tp_spans_nodes
from workloads.inference.protocol import dense_only

# server.* keys that belong to the orchestrator, not to the reference engine's own config.
_ORCHESTRATOR_KEYS = {"adapter", "host", "port", "nnodes", "node_rank", "dist_init_addr", "model_path", "extra_args",
                      "env", "url", "health_path", "ready_timeout_s", "stop_timeout_s", "tp"}


# Its TP ranks span the emulated nodes (launch/emulate.py checks this before building them).
spans_emulated_nodes = tp_spans_nodes

def check_available(spec: ServerSpec, server: dict) -> None:
    """A broken checkpoint is one line here, not the server's traceback in its log."""
    if spec.nnodes > 1 and emulated_nodes() is None:
        raise UsageError(f"server=reference with server.nnodes={spec.nnodes} runs only across emulated nodes "
                         "(launch/emulate.py launch/infer.py fabric=emu-100m server.tp=2); on a real cluster "
                         "use server=vllm or server=sglang for multi-node serving")
    if server.get("checkpoint"):
        from workloads.models.hf import load_hf_config

        load_hf_config(server["checkpoint"])
    # The engine's own settings, checked as the engine will check them: a bad one is one line
    # here, not found after the server started and then shown as its log's traceback.
    import dataclasses

    from workloads.inference.engine.engine import EngineSettings

    names = {f.name for f in dataclasses.fields(EngineSettings)}
    settings = EngineSettings(**{k: v for k, v in server.items() if k in names and v is not None})
    if settings.dtype == "fp16":
        import torch

        if not torch.cuda.is_available():  # the engine's ranks run on this host's devices
            raise UsageError("server.dtype=fp16 needs a GPU and this machine has none; on CPU use server.dtype=fp32 "
                             "or bf16")


def forwarded_overrides(overrides: list[str]) -> tuple[str, ...]:
    """CLI overrides the reference engine must see too (its model shape, its fabric's settings,
    its server knobs); the fabric and model choices themselves are `command`'s arguments."""
    keep = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key.startswith(("model.", "dist.", "fabric.")) or key == "seed":
            keep.append(o)
        elif key.startswith("server.") and key.split(".")[1] not in _ORCHESTRATOR_KEYS:
            keep.append(o)
    return tuple(keep)


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    dense_only(model)
    serve = str(REPO_ROOT / "launch" / "serve.py")
    if spec.nnodes == 1:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={spec.tp}", serve]
    else:
        # launch/emulate.py's namespaces (check_available refuses nnodes > 1 elsewhere): one
        # torchrun agent in each, rendezvous on node 0's emu0 address, rank 0's HTTP on the
        # host link (server.host, which emulate sets).
        argv = [sys.executable, "-m", "workloads.commands.emulate", "--serve", str(spec.tp // spec.nnodes), serve]
    argv.append(f"model={model.get('name')}")
    if fabric:
        argv.append(f"fabric={fabric}")
    argv += [f"server.host={spec.host}", f"server.port={spec.port}"]
    if spec.run_dir:  # the sweep's own folder (Hydra makes it; no folder of the engine's own)
        argv += [f"output_root={hydra_value(str(Path(spec.run_dir).parent))}", f"run_id={Path(spec.run_dir).name}"]
    argv += [*overrides, *spec.extra_args]
    return Launch(argv, dict(spec.env), spec.served_model_name or str(model.get("name")), own_network=spec.nnodes > 1)
