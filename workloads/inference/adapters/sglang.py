"""SGLang: `python -m sglang.launch_server` (docs.sglang.io, "Multi-Node Deployment").

Multi-node tensor parallelism: the same command on every node with `--tp-size` the total
degree (the field `tp_size` in sglang/srt/arg_groups/fields/parallel.py; the docs' `--tp`
is only argparse's prefix abbreviation of it), `--dist-init-addr` node 0's host:port,
`--nnodes` and `--node-rank`.
"""

from __future__ import annotations

import importlib.util
import sys

from workloads.core.errors import UsageError
from workloads.inference.adapters.base import Launch, ServerSpec, model_path


def check_available(spec: ServerSpec, server: dict) -> None:
    if not spec.python and importlib.util.find_spec("sglang") is None:
        raise UsageError("server=sglang: SGLang is not installed in this Python; run in the sglang container "
                         "(Dockerfile target sglang) or set server.python (FB_ENGINE_PYTHON) to an interpreter that has it")


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    path = model_path(spec, model)
    argv = [spec.python or sys.executable, "-m", "sglang.launch_server", "--model-path", path,
            "--tp-size", str(spec.tp), "--host", spec.host, "--port", str(spec.port)]
    if spec.nnodes > 1:
        argv += ["--dist-init-addr", str(spec.dist_init_addr), "--nnodes", str(spec.nnodes),
                 "--node-rank", str(spec.node_rank)]
    name = spec.served_model_name
    if name:
        argv += ["--served-model-name", name]
    return Launch(argv + list(spec.extra_args), dict(spec.env), name or path)
