"""server=vllm-pd on one node with GPUs: each instance on its own (CUDA_VISIBLE_DEVICES per role).
The GPU host is played at the boundary this module reads (host_has_gpu, CUDA_VISIBLE_DEVICES):
no GPU here. The argv and environment are what command() hands to serve.py."""

from __future__ import annotations

import json

import pytest

from workloads.core.errors import UsageError
from workloads.inference.adapters import vllm_pd
from workloads.inference.adapters.base import ServerSpec

MODEL = {"name": "llama-3.1-8b", "path": "/models/llama"}


def _plan(spec: ServerSpec) -> dict:
    launch = vllm_pd.command(spec, MODEL)
    return json.loads(launch.argv[-1])


@pytest.fixture
def gpu_host(monkeypatch):
    monkeypatch.setattr(vllm_pd, "host_has_gpu", lambda: True)
    return monkeypatch


@pytest.mark.parametrize("visible, tp, want", [
    ("0,1", 1, ("0", "1")),
    ("0,1,2,3,4,5,6,7", 4, ("0,1,2,3", "4,5,6,7")),
    ("2,5,6,7", 2, ("2,5", "6,7")),       # the node's own numbering (e.g. Slurm's allocation) is kept
    ("0,1,2", 1, ("0", "1")),             # a spare GPU stays unused
])
def test_prefill_and_decode_get_their_own_gpus(gpu_host, tmp_path, visible, tp, want):
    gpu_host.setenv("CUDA_VISIBLE_DEVICES", visible)
    plan = _plan(ServerSpec("vllm_pd", tp=tp, run_dir=str(tmp_path)))
    assert (plan["prefill"]["env"]["CUDA_VISIBLE_DEVICES"], plan["decode"]["env"]["CUDA_VISIBLE_DEVICES"]) == want
    assert all(plan[r]["argv"][plan[r]["argv"].index("--tensor-parallel-size") + 1] == str(tp) for r in ("prefill", "decode"))


def test_too_few_gpus_is_one_line_naming_the_fix(gpu_host, tmp_path):
    gpu_host.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    spec = ServerSpec("vllm_pd", tp=2, run_dir=str(tmp_path))
    with pytest.raises(UsageError, match=r"4 GPUs, and this node shows 3 \(0, 1, 2\); lower server.tp, run P and D "
                                         r"on two nodes, or place them yourself with server.env.CUDA_VISIBLE_DEVICES"):
        vllm_pd.check_available(spec, {})


@pytest.mark.parametrize("case", ["cpu", "user placement", "unlisted"])
def test_left_alone(monkeypatch, tmp_path, case):
    env = {}
    monkeypatch.setattr(vllm_pd, "host_has_gpu", lambda: case != "cpu")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if case == "user placement":  # both on GPU 3, as the user asked
        env = {"CUDA_VISIBLE_DEVICES": "3"}
    if case == "unlisted":  # a GPU host whose GPUs this module cannot list (no /dev/nvidia<N> here)
        monkeypatch.setattr(vllm_pd, "visible_gpus", lambda: [])
    plan = _plan(ServerSpec("vllm_pd", tp=1, run_dir=str(tmp_path), env=env))
    got = {r: plan[r]["env"].get("CUDA_VISIBLE_DEVICES") for r in ("prefill", "decode")}
    assert got == {"prefill": env.get("CUDA_VISIBLE_DEVICES"), "decode": env.get("CUDA_VISIBLE_DEVICES")}


def test_device_node_minors_are_not_cuda_indices(monkeypatch, tmp_path):
    """A container given the host's GPUs 2 and 3 sees /dev/nvidia2 and /dev/nvidia3, and CUDA
    calls them 0 and 1: CUDA_VISIBLE_DEVICES=2 there names no GPU and the engine exits."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert vllm_pd.visible_gpus(tmp_path) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # set by the runtime or the user: taken as it is
    assert vllm_pd.visible_gpus(tmp_path) == ["2", "3"]
