"""A serving engine is one adapter module plus one YAML (docs/engines.md, "Adding a serving engine").

The throwaway engine here lives entirely outside the repository: a module on PYTHONPATH
and a conf/server/<name>.yaml on Hydra's search path. Its `command()` starts the scripted
SSE server, so the sweep below is the real orchestrator (own process group, readiness,
stop) and the real load generator, with no edit to fabricbench.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO
from workloads.core.ports import free_port
from workloads.inference.adapters import builtin, get_adapter

ENGINE = '''
import sys
from workloads.inference.adapters.base import Launch

def command(spec, model, fabric=None, overrides=()):
    argv = [sys.executable, "-m", "workloads.testing.scripted_server", "--host", spec.host,
            "--port", str(spec.port), "--ttft-ms", "3", "--itl-ms", "1"]
    return Launch(argv, dict(spec.env), spec.served_model_name or "scripted")
'''


def test_builtin_adapters_are_the_modules_of_the_package():
    assert builtin() == ["external", "reference", "sglang", "sglang_pd", "vllm", "vllm_pd"]
    assert not get_adapter("external").starts_process and get_adapter("vllm").starts_process


@pytest.mark.slow
def test_one_module_and_one_yaml_add_an_engine(tmp_path):
    (tmp_path / "fbtest").mkdir()
    (tmp_path / "fbtest" / "__init__.py").write_text("")
    (tmp_path / "fbtest" / "engine.py").write_text(ENGINE)
    conf = tmp_path / "conf" / "server"
    conf.mkdir(parents=True)
    (conf / "scripted.yaml").write_text(
        f"name: scripted\nadapter: fbtest.engine\nhost: 127.0.0.1\nport: {free_port()}\ntp: 1\n"
        "health_path: /health\nready_timeout_s: 60\nstop_timeout_s: 10\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}", OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    out = tmp_path / "res"
    p = subprocess.run([sys.executable, "launch/infer.py", "server=scripted", f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
                        "load.points=[1,2]", "load.num_requests=6", "load.warmup_requests=1",
                        "load.dataset.input_len=8", "load.dataset.output_len=4", f"output_root={out}", "run_id=reg"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    recs = [json.loads(f.read_text()) for f in sorted(out.rglob("records/*.json"))]
    assert sorted(r["point"] for r in recs) == ["c1", "c2"]
    for r in recs:
        assert r["status"] == "ok" and r["server"]["adapter"] == "fbtest.engine"
        assert r["metrics"]["completed"] == 6 and r["metrics"]["total_output_tokens"] == 6 * 4
        assert r["server"]["argv"][1:3] == ["-m", "workloads.testing.scripted_server"]
    log = out / "reg" / "server" / "fbtest.engine.log"
    assert log.is_file(), sorted(str(x) for x in out.rglob("*"))
