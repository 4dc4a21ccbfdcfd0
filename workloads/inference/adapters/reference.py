"""The built-in reference engine (workloads/inference/engine/, launch/serve.py): tensor-parallel
GPT-NeoX over torch.distributed, started with torchrun from the repository root."""

from __future__ import annotations

import sys

from workloads import REPO_ROOT
from workloads.inference.adapters.base import Launch, ServerSpec


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={spec.tp}",
            str(REPO_ROOT / "launch" / "serve.py"), f"model={model.get('name')}"]
    if fabric:
        argv.append(f"fabric={fabric}")
    argv += [f"server.host={spec.host}", f"server.port={spec.port}", *overrides, *spec.extra_args]
    return Launch(argv, dict(spec.env), spec.served_model_name or str(model.get("name")))
