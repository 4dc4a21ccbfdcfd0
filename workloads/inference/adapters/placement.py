"""Where the two instances of a one-node P/D server go: each on its own GPUs (vllm-pd, sglang-pd)."""

from __future__ import annotations

import os
from pathlib import Path

from workloads.core.errors import UsageError
from workloads.inference.adapters.base import ServerSpec
from workloads.inference.adapters.sglang import host_has_gpu

ROLES = ("prefill", "decode")


def visible_gpus(dev: Path = Path("/dev")) -> list[str]:
    """This node's GPUs as CUDA_VISIBLE_DEVICES names them: its value where set, else 0..n-1 for
    the n /dev/nvidia<N> device nodes (no torch or CUDA import in the harness). Never the N
    itself: a container given GPUs 2 and 3 (docker --gpus '"device=2,3"', a Kubernetes pod)
    keeps the host's minors, /dev/nvidia2 and /dev/nvidia3, while CUDA numbers what it sees from
    0 ("From inside a container, you can expect the GPUs to always start at 0",
    NVIDIA/nvidia-docker#907; GoogleCloudPlatform/container-engine-accelerators#72)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    return [str(i) for i in range(len(list(dev.glob("nvidia[0-9]*"))))]


def gpu_split(spec: ServerSpec, engine: str = "cuda") -> dict[str, dict[str, str]]:
    """On one node with GPUs each instance gets its own: the prefill the first server.tp visible
    GPUs, the decode the next server.tp (CUDA_VISIBLE_DEVICES per instance). Both would otherwise
    start on GPU 0 and take its memory twice, and the KV cache would never leave that GPU (whatever
    server.kv_buffer_device says: the engines run on the GPUs either way). Not on a CPU host, not
    across nodes (each node runs one instance on its own GPUs), not where server.env sets
    CUDA_VISIBLE_DEVICES (the user's placement, e.g. both on one GPU with a
    --gpu-memory-utilization each), and not where the GPUs cannot be listed (ROCm without
    CUDA_VISIBLE_DEVICES: vLLM's own placement). `engine`: the engine's platform (engine_device
    for vLLM; SGLang's adapter decides its own): a CPU engine on a GPU host gets no GPUs."""
    if spec.nnodes > 1 or "CUDA_VISIBLE_DEVICES" in spec.env or engine != "cuda" or not host_has_gpu():
        return {}
    gpus, tp = visible_gpus(), spec.tp
    if not gpus:
        return {}
    if len(gpus) < 2 * tp:
        raise UsageError(f"server={spec.adapter.replace('_', '-')} on one node gives the prefill and the decode instance {tp} GPU(s) each "
                         f"(server.tp={tp}): {2 * tp} GPUs, and this node shows {len(gpus)} "
                         f"({', '.join(gpus) or 'none'}); lower server.tp, run P and D on two nodes, or place them "
                         "yourself with server.env.CUDA_VISIBLE_DEVICES (and a --gpu-memory-utilization that fits both)")
    return {role: {"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * tp:(i + 1) * tp])} for i, role in enumerate(ROLES)}
