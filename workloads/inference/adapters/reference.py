"""The built-in reference engine (workloads/inference/engine/, launch/serve.py): tensor-parallel
GPT-NeoX over torch.distributed, started with torchrun from the repository root."""

from __future__ import annotations

import sys

from workloads import REPO_ROOT
from workloads.inference.adapters.base import Launch, ServerSpec

# server.* keys that belong to the orchestrator, not to the reference engine's own config.
_ORCHESTRATOR_KEYS = {"adapter", "host", "port", "nnodes", "node_rank", "dist_init_addr", "model_path", "extra_args",
                      "env", "url", "health_path", "ready_timeout_s", "stop_timeout_s", "tp"}


def check_available(spec: ServerSpec, server: dict) -> None:
    """A broken checkpoint is one line here, not the server's traceback in its log."""
    if server.get("checkpoint"):
        from workloads.models.hf import load_hf_config

        load_hf_config(server["checkpoint"])


def forwarded_overrides(overrides: list[str]) -> tuple[str, ...]:
    """CLI overrides the reference engine must see too (its model shape, its server knobs)."""
    keep = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key.startswith("model.") or key == "seed" or key.startswith("dist."):
            keep.append(o)
        elif key.startswith("server.") and key.split(".")[1] not in _ORCHESTRATOR_KEYS:
            keep.append(o)
    return tuple(keep)


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={spec.tp}",
            str(REPO_ROOT / "launch" / "serve.py"), f"model={model.get('name')}"]
    if fabric:
        argv.append(f"fabric={fabric}")
    argv += [f"server.host={spec.host}", f"server.port={spec.port}", *overrides, *spec.extra_args]
    return Launch(argv, dict(spec.env), spec.served_model_name or str(model.get("name")))
