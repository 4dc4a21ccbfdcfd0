"""The SGLang adapter's command lines, without starting SGLang: the CPU recipe (flags and
environment, docs/engines.md) only where SGLang runs on a CPU, never on a GPU;
one node command per emulated namespace; NeoX refused on a CPU."""

from __future__ import annotations

import json
import sys

import pytest

from workloads.core.errors import UsageError
from workloads.fabric.netns import NODES_ENV
from workloads.inference.adapters import sglang
from workloads.inference.adapters.base import ServerSpec

LLAMA = {"name": "llama-tiny", "path": "/models/llama"}
RECIPE = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--skip-server-warmup",
          "--max-total-tokens", "8192"]


def _spec(**kw) -> ServerSpec:
    return ServerSpec("sglang", python=sys.executable, **kw)


def test_cpu_gets_the_recipe_and_its_environment():
    launch = sglang.command(_spec(tp=2, device="cpu"), LLAMA)
    assert launch.argv[1:3] == ["-m", "sglang.launch_server"]
    assert launch.argv[-len(RECIPE):] == RECIPE
    assert launch.env["SGLANG_NCCL_SO_PATH"] == sglang.NO_NCCL
    assert len(launch.env["SGLANG_CPU_OMP_THREADS_BIND"].split("|")) == 2  # one core group per TP rank
    assert launch.env["SPT_NOENV"] == "1"


@pytest.mark.parametrize("how", [{"device": "cuda"}, {"extra_args": ("--device", "cuda")}])
def test_a_gpu_never_gets_the_cpu_recipe(how):
    launch = sglang.command(_spec(tp=2, **how), LLAMA)
    flags = {"--attention-backend", "--disable-cuda-graph", "--skip-server-warmup", "--max-total-tokens"}
    assert not flags & set(launch.argv) and launch.argv.count("--device") == len(how.get("extra_args", ())) // 2
    assert "SGLANG_NCCL_SO_PATH" not in launch.env and "SGLANG_CPU_OMP_THREADS_BIND" not in launch.env


def test_auto_means_cpu_only_where_the_host_has_no_gpu(monkeypatch, tmp_path):
    node = tmp_path / "nvidiactl"
    monkeypatch.setattr(sglang, "GPU_DEVICE_NODES", (str(node),))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert sglang.command(_spec(device="auto"), LLAMA).argv[-len(RECIPE):] == RECIPE
    node.touch()  # a GPU's device node, even when this Python's torch cannot use it
    assert "--attention-backend" not in sglang.command(_spec(device="auto"), LLAMA).argv


def test_extra_args_come_after_the_recipe_so_they_win():
    launch = sglang.command(_spec(device="cpu", extra_args=("--max-total-tokens", "2048")), LLAMA)
    assert launch.argv[-4:] == ["--max-total-tokens", "8192", "--max-total-tokens", "2048"]


def test_core_binding_splits_this_hosts_cores_among_its_ranks(monkeypatch):
    monkeypatch.setattr(sglang.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    assert sglang._cpu_binding(2, 0, 2) == "0-1|2-3"
    # two emulated nodes on one host, one rank each: node 0's and node 1's cores do not overlap
    assert (sglang._cpu_binding(2, 0, 1), sglang._cpu_binding(2, 1, 1)) == ("0-1", "2-3")
    assert sglang._cpu_binding(4, 0, 4) == "0|1|2|3"
    monkeypatch.setattr(sglang.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert sglang._cpu_binding(4, 0, 4) == "0|1|0|1"  # more ranks than cores: they share


def test_emulated_nodes_each_get_their_own_command(monkeypatch):
    monkeypatch.setenv(NODES_ENV, "fb-1-0,fb-1-1")  # as launch/emulate.py sets it for the load generator
    monkeypatch.setattr(sglang.os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    spec = _spec(tp=2, nnodes=2, dist_init_addr="10.77.0.1:29500", host="10.78.0.2", device="cpu")
    launch = sglang.command(spec, LLAMA)
    assert launch.own_network and launch.argv[1:4] == ["-m", "workloads.commands.emulate", "--serve-nodes"]
    nodes = json.loads(launch.argv[4])
    for i, node in enumerate(nodes):
        argv = node["argv"]
        assert argv[argv.index("--node-rank") + 1] == str(i) and argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--dist-init-addr") + 1] == "10.77.0.1:29500"
        assert argv[argv.index("--host") + 1] == ("10.78.0.2" if i == 0 else "10.77.0.2")
        assert node["env"]["SGLANG_USE_MESSAGE_QUEUE_BROADCASTER"] == "false"
    binds = [node["env"]["SGLANG_CPU_OMP_THREADS_BIND"] for node in nodes]
    assert binds == ["0-1", "2-3"]  # one rank per node, each on its own half of the host's cores


def test_neox_is_refused_on_cpu_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(UsageError, match="cannot serve GPT-NeoX"):
        sglang.command(_spec(device="cpu", model_path=str(tmp_path)), LLAMA)
    with pytest.raises(UsageError, match="cannot serve GPT-NeoX"):
        sglang.command(_spec(device="cpu"), {"name": "neox-tiny", "path": "x", "gpt_j_residual": True})
    assert sglang.command(_spec(device="cuda", model_path=str(tmp_path)), LLAMA).argv
