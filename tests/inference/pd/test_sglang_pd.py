"""server=sglang-pd's plan (workloads/inference/adapters/sglang_pd.py), in-process: what each
instance is started with, and the bad inputs refused before anything starts. SGLang's own parser
checks these command lines in tests/inference/adapters/test_parsers.py; the proxy's protocol is
tested against real HTTP stand-ins in test_proxy_sglang.py."""

from __future__ import annotations

import json

import pytest

from workloads.core.errors import UsageError
from workloads.inference.adapters import placement, sglang, sglang_pd
from workloads.inference.adapters.base import ServerSpec

MODEL = {"name": "llama-tiny", "path": "/models/llama"}


def _plan(**kw) -> dict:
    spec = ServerSpec("sglang_pd", **kw)
    return json.loads(sglang_pd.command(spec, MODEL).argv[-1])


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_each_instance_has_its_mode_and_the_proxy_the_prefills_bootstrap(tmp_path):
    plan = _plan(run_dir=str(tmp_path), device="cpu", extra_args=("--mem-fraction-static", "0.5"),
                 options={"transfer_backend": "mooncake"})
    p, d = plan["prefill"]["argv"], plan["decode"]["argv"]
    assert (_flag(p, "--disaggregation-mode"), _flag(d, "--disaggregation-mode")) == ("prefill", "decode")
    assert _flag(p, "--disaggregation-transfer-backend") == _flag(d, "--disaggregation-transfer-backend") == "mooncake"
    assert plan["bootstrap"] == ["127.0.0.1", int(_flag(p, "--disaggregation-bootstrap-port"))]
    assert "--disaggregation-bootstrap-port" not in d  # the decode learns it from each request
    assert p[-2:] == d[-2:] == ["--mem-fraction-static", "0.5"]  # extra args last: they win
    assert plan["prefill"]["port"] != plan["decode"]["port"] and plan["name"] == "sglang-pd"
    # on a CPU: SGLang's recipe, and the host's cores split between the two instances
    assert "--device" in p and _flag(p, "--device") == "cpu"
    binds = [plan[r]["env"]["SGLANG_CPU_OMP_THREADS_BIND"] for r in ("prefill", "decode")]
    assert binds == [sglang._cpu_binding(2, 0, 1), sglang._cpu_binding(2, 1, 1)]
    assert all(plan[r]["env"]["UCX_PROTO_INFO"] == "y" for r in ("prefill", "decode"))
    assert plan["prefill"]["log"].endswith("server/sglang-pd-prefill.log")


def test_on_a_gpu_node_each_instance_gets_its_own_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(placement, "host_has_gpu", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    plan = _plan(run_dir=str(tmp_path), tp=2, device="cuda")
    assert [plan[r]["env"]["CUDA_VISIBLE_DEVICES"] for r in ("prefill", "decode")] == ["0,1", "2,3"]
    assert "SGLANG_CPU_OMP_THREADS_BIND" not in plan["prefill"]["env"] and "--device" not in plan["prefill"]["argv"]


@pytest.mark.parametrize("kw, message", [
    ({"options": {"bootstrap": 1}}, "server=sglang-pd has no key 'bootstrap'"),
    ({"nnodes": 2, "dist_init_addr": "10.0.0.1:5000"}, "server=sglang-pd runs its prefill and decode instances on one "
                                                        "node (server.nnodes=1, not 2); across nodes use server=vllm-pd"),
])
def test_refused_in_one_line(kw, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sglang_pd.check_available(ServerSpec("sglang_pd", python="/usr/bin/python3", **kw), {})


def test_a_cpu_host_is_refused_before_anything_starts():
    """Tried here (SGLang 0.5.23, nixl 1.5.1): the prefill instance died on NIXL's VRAM registration
    and the decode instance on torch.cuda.cudart(); the adapter says so before two engines start."""
    with pytest.raises(UsageError, match=r"server=sglang-pd needs GPUs: .*VRAM memory is detected as host by UCX.*"
                                         r"on a CPU use server=vllm-pd"):
        sglang_pd.check_available(ServerSpec("sglang_pd", python="/usr/bin/python3", device="cpu"), {})


def test_a_backend_sglang_lacks_is_refused_from_its_own_choices(monkeypatch):
    monkeypatch.setattr(sglang_pd, "known_backends", lambda spec: ["mooncake", "nixl", "fake"])
    spec = ServerSpec("sglang_pd", python="/usr/bin/python3", options={"transfer_backend": "rdma9"})
    with pytest.raises(UsageError, match="server.transfer_backend='rdma9': this SGLang has no such disaggregation "
                                         "transfer backend; it has mooncake, nixl, fake"):
        sglang_pd.check_available(spec, {})
