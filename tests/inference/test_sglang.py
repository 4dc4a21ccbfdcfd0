"""SGLang for real on this CPU: `launch/infer.py server=sglang` against .engines/sglang
(`make engines`; the fixture runs it, so these never skip), a tiny Llama model built here
(random weights, local word-level tokenizer; nothing downloaded), served at TP=1 on loopback
and at TP=2 (its TP all-reduce over Gloo) across two emulated nodes.

A server start takes 1.5-2.5 min on 2 shared cores, so one sweep serves every check of it
(module-scoped fixtures), at TP=1 and across nodes alike:
- the records' metrics agree with the load generator's own per-request samples;
- SGLang's TP ranks (its scheduler processes) carry the fabric's environment and their Gloo
  sockets are on the fabric's interface: the verdict comes from workloads/fabric/verify.py's
  socket tables of the server's processes, the rule vLLM's workers are judged by;
- the CPU recipe reached the engine (flags in its argv, the per-rank core binding in its log);
- `load.flush_cache_path=/flush_cache` reaches SGLang before every point.
Across nodes: the two nodes' schedulers in two namespaces (launch/emulate.py), once on an
unshaped veth and once at 100 Mbit/s, with a model whose prefill all-reduces queue on the link.
A TP=2 sweep on loopback (one node) ran here too until 2026-11-28 (132 s of the suite); the
emulated pair starts the same two schedulers, one per node, and test_parsers.py checks the
single-node command line against SGLang's own parser.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis.stats import hodges_lehmann, permutation_p
from helpers import REPO, child_env, need, quiet_port, records_in, run_entry
from helpers.hf_tiny import model_dir
from helpers.serving_checks import check_gloo_ranks_on_lo, check_metrics_match_the_samples
from workloads.fabric.netns import leftovers
from workloads.inference.adapters.sglang import _cpu_binding

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SGLANG = REPO / ".engines" / "sglang"
POINTS = [1, 3]
REQUESTS, OUT_LEN = 6, 8
CPU_FLAGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--skip-server-warmup",
             "--max-total-tokens", "8192"]


@pytest.fixture(scope="session")
def sglang_env() -> Path:
    """`make engines` (a no-op when .engines/ is current); an install failure fails the tests."""
    r = subprocess.run(["make", "engines"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"make engines failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return SGLANG / "bin" / "python"


def _llama(tmp_path_factory, **over) -> tuple[Path, list[str]]:
    """A llama-tiny directory (with `over` changed) and the model overrides that describe it."""
    shape = yaml.safe_load((REPO / "conf" / "model" / "llama-tiny.yaml").read_text()) | over
    path = model_dir(tmp_path_factory.mktemp("llama"), "llama", shape, vocab_size=int(shape["vocab_size"]))
    return path, ["model=llama-tiny", *(f"model.{k}={v}" for k, v in over.items()), f"server.model_path={path}"]


@pytest.fixture(scope="module", params=[1], ids=lambda tp: f"llama-tiny-tp{tp}")
def sweep(request, sglang_env, tmp_path_factory):
    tp = request.param
    _, model = _llama(tmp_path_factory)
    out = tmp_path_factory.mktemp("results")
    r = run_entry("infer.py", "server=sglang", *model, f"server.tp={tp}", f"server.port={quiet_port()}",
                  "server.ready_timeout_s=900", "+fabric.env.NCCL_SOCKET_IFNAME=lo", f"output_root={out}",
                  "run_id=sglang", f"load.points=[{','.join(map(str, POINTS))}]", f"load.num_requests={REQUESTS}",
                  "load.warmup_requests=1", "load.dataset.input_len=24", f"load.dataset.output_len={OUT_LEN}",
                  "load.flush_cache_path=/flush_cache", timeout=1500)
    return tp, records_in(out), out, r


def _log(out: Path) -> str:
    return next(out.rglob("server/sglang.log")).read_text(errors="replace")


def test_sglang_sweep_runs_on_the_cpu_recipe(sweep, sglang_env):
    tp, recs, out, r = sweep
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n{_log(out)[-3000:]}"
    assert sorted(x["point"] for x in recs) == sorted(f"c{c}" for c in POINTS)
    for x in recs:
        assert x["status"] == "ok" and x["server"]["adapter"] == "sglang" and x["server"]["tp"] == tp
        argv = x["server"]["argv"]
        assert argv[0] == str(sglang_env) and argv[1:3] == ["-m", "sglang.launch_server"]  # the .engines rule
        assert " ".join(CPU_FLAGS) in " ".join(argv)
    # SGLANG_CPU_OMP_THREADS_BIND reached every rank: SGLang logs each rank's cores
    bound = re.findall(r"init_threads_binding: numa_index=(\d+), world_size=(\d+), local_omp_cpuid=(\S+)", _log(out))
    want = x["server"].get("env", {}).get("SGLANG_CPU_OMP_THREADS_BIND") or _cpu_binding(tp, 0, tp)
    assert sorted(bound) == [(str(i), str(tp), c) for i, c in enumerate(want.split("|"))], bound


def test_metrics_match_the_samples(sweep):
    check_metrics_match_the_samples(sweep[1], REQUESTS, OUT_LEN)


def test_fabric_env_and_gloo_transport_of_sglang_ranks(sweep):
    """verify.py's socket-table rule on SGLang's own processes: at TP=2 its two schedulers."""
    tp, recs, _, _ = sweep
    # At TP=1 the one scheduler holds one connection, to its own torch.distributed store (the
    # TCPStore it hosts on the dist port), so it is found as the one rank; nothing crossed a fabric.
    check_gloo_ranks_on_lo(recs[0]["fabric"]["transport"], tp)


def test_flush_cache_reaches_sglang(sweep):
    _, recs, out, _ = sweep
    assert all(x["dataset"]["cache_flushed"] for x in recs)
    flushed = re.findall(r'"POST /flush_cache HTTP/1\.1" 200', _log(out))
    assert len(flushed) == len(POINTS), _log(out)[-3000:]


# ---------------------------------------------------------------------------------------
# Across emulated nodes (root). Why TTFT must rise at 100 Mbit/s: hidden 1024 and 512-token
# prompts make every prefill all-reduce (512, 1024) fp32 activations twice per layer, 4 x 2 MiB
# over 2 layers; at 2 ranks each rank sends S bytes per all-reduce, 8 MiB per prefill, ~670 ms
# at the link's 12.5 MB/s (less the tbf burst), against a few ms on an unshaped veth. (With
# 256-token prompts, 335 ms, the shaped TTFTs were 503-580 ms against 237-522 ms unshaped on a
# loaded machine: too close to call with 8 requests each.)
EMU_SHAPE = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 2, "intermediate_size": 1024,
             "max_position_embeddings": 1024}
EMU_REQUESTS, EMU_OUT_LEN = 8, 4


@pytest.fixture(scope="module")
def across_nodes(sglang_env, tmp_path_factory):
    need("root")
    _, model = _llama(tmp_path_factory, **EMU_SHAPE)
    out = tmp_path_factory.mktemp("emu")
    runs = {}
    for label, rate in [("veth", ["--rate", "none"]), ("100m", [])]:  # sequential: 2 cores
        p = subprocess.run([sys.executable, str(REPO / "launch" / "emulate.py"), *rate, "launch/infer.py",
                            "fabric=emu-100m", "server=sglang", "server.tp=2", *model, "server.ready_timeout_s=900",
                            f"output_root={out}", f"run_id=sglang-{label}", "load.points=[1]",
                            f"load.num_requests={EMU_REQUESTS}", "load.warmup_requests=1",
                            "load.dataset.input_len=512", f"load.dataset.output_len={EMU_OUT_LEN}",
                            "load.flush_cache_path=/flush_cache",
                            # fp32 activations, as the arithmetic above counts them
                            "server.extra_args=[--dtype,float32]"],
                           cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=1500)
        assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        runs[label] = p.stdout
    return {r["fabric"]["name"]: r for r in records_in(out)}, out, runs


@pytest.mark.timing  # shares across_nodes with the TTFT test
@pytest.mark.requires("root")
def test_sglang_tp2_ranks_span_both_namespaces_on_emu0(across_nodes):
    recs, out, runs = across_nodes
    assert sorted(recs) == ["emu-100m", "emu-veth"]
    for rec in recs.values():
        assert rec["status"] == "ok" and rec["metrics"]["completed"] == EMU_REQUESTS
        assert rec["server"]["nnodes"] == 2 and rec["server"]["url"].startswith("http://10.78.")
        assert rec["server"]["argv"][1:4] == ["-m", "workloads.commands.emulate", "--serve-nodes"]
        t = rec["fabric"]["transport"]
        assert t["verdict"] == "ok", t
        ranks = t["summary"]["ranks"]
        # one scheduler per namespace, each on its own node's end of the shaped veth
        assert sorted(x["addresses"][0] for x in ranks) == ["10.77.0.1", "10.77.0.2"], ranks
        assert all(x["interfaces"] == ["emu0"] and x["env"]["GLOO_SOCKET_IFNAME"] == "emu0" for x in ranks)
    for log in out.rglob("server/sglang.log"):
        text = log.read_text(errors="replace")
        # one API server, node 0's, on the host link; node 1 ran a scheduler and SGLang's health stub
        assert [a.startswith("10.78.") for a in re.findall(r"Uvicorn running on http://([\d.]+):", text)] == [True]
        assert "Dummy health check server started in background thread at 10.77.0.2:" in text
    # the CPU recipe reached each node's engine: its flags, and the core each node's scheduler was
    # bound to (SGLANG_CPU_OMP_THREADS_BIND, one rank per node) in that scheduler's own log line
    for rec in recs.values():
        nodes = json.loads(rec["server"]["argv"][-1])
        assert [n["argv"][1:3] for n in nodes] == [["-m", "sglang.launch_server"]] * 2
        assert all(" ".join(CPU_FLAGS) in " ".join(n["argv"]) for n in nodes), nodes
        log = (out / f"sglang-{rec['fabric']['name'].removeprefix('emu-')}" / "server" / "sglang.log").read_text(
            errors="replace")
        bound = re.findall(r"TP(\d+)\] init_threads_binding: numa_index=\d+, world_size=(\d+), local_omp_cpuid=(\S+)",
                           log)
        assert sorted(bound) == [(str(i), "2", n["env"]["SGLANG_CPU_OMP_THREADS_BIND"]) for i, n in enumerate(nodes)], bound
        # /flush_cache reached node 0's API server before the one point
        assert rec["dataset"]["cache_flushed"] and len(re.findall(r'"POST /flush_cache HTTP/1\.1" 200', log)) == 1
    # this test's namespaces are gone (other jobs on the machine may hold fb-* ones of their own)
    ours = [n for stdout in runs.values() for n in re.search(r"namespaces \(([^)]*)\)", stdout).group(1).split(", ")]
    assert len(ours) == 4 and not set(ours) & set(leftovers()), (ours, leftovers())


@pytest.mark.timing  # shares across_nodes with the TTFT test
@pytest.mark.requires("root")
def test_metrics_across_nodes_match_the_samples(across_nodes):
    check_metrics_match_the_samples(list(across_nodes[0].values()), EMU_REQUESTS, EMU_OUT_LEN)


@pytest.mark.timing  # a TTFT ratio
@pytest.mark.requires("root")
def test_sglang_ttft_rises_at_100mbit(across_nodes):
    """The per-request TTFTs of one point each (requests are not trials; this checks the link
    reaches SGLang's all-reduces, not a fabric verdict, which needs runs: analysis/stats.py)."""
    recs, _, _ = across_nodes
    ttft = {k: [q["ttft_s"] for q in r["samples"]["requests"] if q["ok"]] for k, r in recs.items()}
    shaped, veth = ttft["emu-100m"], ttft["emu-veth"]
    shift, lo, hi = hodges_lehmann([math.log(v) for v in shaped], [math.log(v) for v in veth])
    assert permutation_p(shaped, veth) < 0.01 and math.exp(lo) > 1.3, (math.exp(shift), math.exp(lo), shaped, veth)
    # and the shaped TTFT carries at least the wire time of the prefill's all-reduces (8 MiB at 12.5 MB/s)
    assert min(shaped) > 0.8 * 8 * 2**20 / 12.5e6, shaped
