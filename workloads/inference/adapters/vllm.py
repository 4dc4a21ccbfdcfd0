"""vLLM: `vllm serve <model> --tensor-parallel-size N` (docs.vllm.ai, "Parallelism and
Scaling").

Multi-node without Ray (vLLM's multiprocessing backend): every node runs the same
command with `--nnodes`, `--node-rank` and `--master-addr`/`--master-port` (node 0's
address); nodes other than 0 add `--headless` (no API server). `server.tp` is the
total tensor-parallel degree across nodes.
"""

from __future__ import annotations

from workloads.inference.adapters.base import Launch, ServerSpec, model_path


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    path = model_path(spec, model)
    argv = [spec.executable or "vllm", "serve", path, "--tensor-parallel-size", str(spec.tp), "--host", spec.host,
            "--port", str(spec.port)]
    if spec.nnodes > 1:
        addr, _, port = str(spec.dist_init_addr).rpartition(":")
        argv += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank), "--master-addr", addr or port]
        if addr and port:
            argv += ["--master-port", port]
        if spec.node_rank > 0:
            argv.append("--headless")
    name = spec.served_model_name
    if name:
        argv += ["--served-model-name", name]
    return Launch(argv + list(spec.extra_args), dict(spec.env), name or path)
