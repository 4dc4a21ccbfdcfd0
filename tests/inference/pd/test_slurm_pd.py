"""server=vllm-pd on two real Slurm nodes: launch/slurm/inference.sbatch with FB_ENGINE=vllm-pd on
the private one-machine Slurm (munged, slurmctld, two slurmd, both nodes at 127.0.0.1). Node 0 runs
launch/infer.py, which starts the prefill instance and the proxy and drives the load; node 1 runs
`python -m workloads.inference.worker`, which composes the same config and starts the decode
instance on FB_SERVE_PORT + 1, with its log in the job's shared run directory. The KV cache moves
between the two instances over NIXL/UCX (cma or tcp on one host: the loopback profile's
expectation; on a real cluster the profile names the RDMA transports instead), with vLLM's default
connector, NixlConnector (pull: the decode instance reads the blocks; test_emulated_pd.py runs the
push connector across emulated nodes).

ONE job, two vLLM start-ups (each engine in its API server's process, as conf/study/emu-pd.yaml
runs them: ~1-2 min on a 2-core machine), 3 requests plus a warm-up, serves every check of a P/D
sweep (a second P/D pair on loopback outside Slurm ran the same checks until 2026-11-28; it cost
the suite two more vLLM start-ups):
- the record's metrics agree with the load generator's own samples (as for server=vllm);
- the KV bytes each transfer moved, from the decode instance's own `KV Transfer metrics` lines,
  equal the model's KV size for the prompt (2 x layers x KV heads x head_dim x fp32, in whole
  128-token CPU blocks), every transfer succeeded, and the proxy's TTFT split adds up;
- the KV-path verdict, from UCX's own protocol table in the decode instance's log, is ok against
  fabric=loopback's kv_transports [cma, tcp], and names what carried the read;
- no vLLM process of the job is left.
The job runs NIXL's progress thread with a 1 ms poll timeout (server.nixl_pthr_delay_us), as the
emu-pd study does, and the record says each instance used it (test_nixl_shim.py: what it changes)."""

from __future__ import annotations

import subprocess

import pytest

from helpers import REPO, child_env, records_in
from helpers.serving_checks import check_metrics_match_the_samples
from helpers.slurm_cluster import SlurmCluster, our_leftover_pids
from workloads.core.ports import quiet_ports

pytestmark = [pytest.mark.slow, pytest.mark.requires("root", "slurm"), pytest.mark.timeout(1500)]

REQUESTS, OUT_LEN = 3, 4
BLOCK = 128 * 1024  # one 128-token KV block of llama-tiny (2 x 2 layers x 2 heads x 32 x fp32 x 128)


@pytest.fixture(scope="module")
def job(vllm_python, tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm-pd")
    out = root / "results"
    port = quiet_ports(1, width=2)[0]  # the proxy's, and the decode instance's (+1)
    with SlurmCluster(root / "slurm", nodes=2) as c:
        env = c.env(child_env(FB_ENGINE="vllm-pd", FB_MODEL_PATH=str(tiny_llama), FB_TP="1",
                              FB_SERVE_PORT=str(port), FB_SRUN_WAIT="20"))
        r = subprocess.run(
            ["sbatch", "--parsable", "--wait", "--nodes=2", f"--output={root}/pd-%j.out", "--time=20",
             "launch/slurm/inference.sbatch", "fabric=loopback", "model=llama-tiny", "server.served_model_name=tiny",
             "server.extra_args=[--dtype,float32,--max-num-seqs,4,--enforce-eager,--distributed-executor-backend,uni]",
             "+server.env.VLLM_CPU_KVCACHE_SPACE=1", "+server.env.VLLM_ENABLE_V1_MULTIPROCESSING=0",
             "server.ready_timeout_s=900", "server.nixl_pthr_delay_us=1000", f"output_root={out}", "load.points=[1]", f"load.num_requests={REQUESTS}",
             "load.warmup_requests=1", "load.dataset.input_len=24", f"load.dataset.output_len={OUT_LEN}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
        job_id = r.stdout.strip().split(";")[0]
        log = next(iter(root.glob("pd-*.out")), None)
        text = log.read_text(errors="replace") if log else f"(no job output; sbatch said {r.stdout}{r.stderr})"
    assert our_leftover_pids(str(c.conf).encode()) == []
    return r, text, records_in(out), out, job_id, port, tiny_llama


def test_prefill_on_node_0_and_decode_on_node_1_serve_the_sweep(job):
    r, text, recs, out, job_id, port, _ = job
    assert r.returncode == 0, text[-4000:]
    assert "2 node(s) [127.0.0.1 127.0.0.1]" in text, text[-3000:]
    # node 1's worker started the decode instance on FB_SERVE_PORT + 1, and ended with the job
    assert "fabricbench worker (node 1):" in text and f"vllm-pd: decode instance ready on port {port + 1}" in text, \
        text[-4000:]
    (rec,) = recs
    assert rec["status"] == "ok" and rec["metrics"]["completed"] == REQUESTS, rec.get("error")
    assert rec["server"]["nnodes"] == 2 and rec["run_id"] == f"slurm-{job_id}"
    # node 0's serve.py started its prefill and waited for node 1's decode at node 1's address
    server = out / f"slurm-{job_id}" / "server"
    node0 = (server / "vllm_pd.log").read_text(errors="replace")
    assert "vllm-pd: prefill instance ready on port" in node0, node0[-3000:]
    assert f"vllm-pd: decode instance ready on 127.0.0.1:{port + 1}" in node0, node0[-3000:]
    # the decode instance's log is in the job's run directory, written by node 1
    assert (server / "vllm-pd-decode.log").read_text(errors="replace").startswith("# decode: ")


def test_metrics_match_the_samples(job):
    check_metrics_match_the_samples(job[2], REQUESTS, OUT_LEN)


def test_the_engine_is_the_engines_venv(job, vllm_python):
    """The engine's versions are the vLLM venv's (its torch), not those of the wrapper serve.py runs in."""
    engine = job[2][0]["fingerprint"]["engine"]
    assert engine["python"] == str(vllm_python) and engine["torch"].startswith("2.13"), engine


def test_kv_bytes_match_the_model(job):
    (rec,) = job[2]
    kv = rec["kv"]
    # llama-tiny: 2 layers x 2 KV heads x head_dim 128/4 x (K, V) x 4 B = 1 KiB a token; a 24-token
    # prompt fills one 128-token block (vLLM's CPU default), so every transfer is 128 KiB
    assert kv["bytes_per_token"] == 2 * 2 * 32 * 2 * 4
    assert kv["expected_bytes_per_transfer"] == BLOCK and kv["block_size"] == 128
    assert kv["transfers"] >= 1 and kv["failed"] == 0 and kv["expired"] == 0
    assert kv["bytes_per_transfer"] == BLOCK and kv["matches_model"] is True
    assert kv["xfer_ms_mean"] > 0 and kv["xfer_ms_p90_max"] > 0  # successful transfers were timed
    m = rec["metrics"]  # the headline KV figures among the metrics, for comparisons
    assert (m["kv_bytes_per_transfer"], m["kv_xfer_ms_mean"]) == (kv["bytes_per_transfer"], kv["xfer_ms_mean"])
    # the proxy timed every request's prefill leg: warm-up + measured
    assert len(kv["prefill_leg_ms"]) == REQUESTS + 1 and all(x > 0 for x in kv["prefill_leg_ms"])
    assert len(kv["decode_first_ms"]) == REQUESTS + 1 and all(x > 0 for x in kv["decode_first_ms"])
    # TTFT split over the measured requests: the legs' means, measured by the proxy, sum with what
    # lies outside them to the client's mean TTFT (from the samples), and the decode leg holds the
    # engine's KV transfer
    split = kv["ttft_split_ms"]
    assert split["requests"] == REQUESTS and split["ttft"] == pytest.approx(rec["metrics"]["mean_ttft_ms"], abs=1e-3)
    assert split["prefill_leg"] == pytest.approx(sum(kv["prefill_leg_ms"][1:]) / REQUESTS, abs=2e-3)
    assert split["decode_to_first_chunk"] == pytest.approx(sum(kv["decode_first_ms"][1:]) / REQUESTS, abs=2e-3)
    assert split["prefill_leg"] + split["decode_to_first_chunk"] + split["outside_legs"] == pytest.approx(split["ttft"], abs=2e-3)
    # the split is rounded to 0.001 ms and xfer_ms_mean is not: 8.2965 rounds to 8.296, 0.0005 away, which
    # in binary is a hair over 5e-4 (a run failed on exactly that), so the bound is the split's resolution
    assert split["outside_legs"] > 0 and split["kv_xfer"] == pytest.approx(kv["xfer_ms_mean"], abs=1e-3), split


def test_the_kv_path_is_verified(job):
    (rec,) = job[2]
    v = rec["fabric"]["kv_path"]
    assert v["verdict"] == "ok" and v["expect"] == {"kv_transports": ["cma", "tcp"]}, v
    used = v["summary"]["kv_transports"]
    assert used and set(used) <= {"cma", "tcp"}, v["summary"]
    assert v["warmup"]["ok"] is True and v["warmup"]["attempts"] in (1, 2)
    assert rec["fabric"]["transport"]["verdict"] in ("ok", "unverified")  # the Gloo verdict stays beside it
    # server.nixl_pthr_delay_us=1000 reached each instance's NIXL agent (its own log says so)
    assert v["nixl_pthr_delay_us"] == {"prefill": 1000, "decode": 1000}
    # both "nodes" are this host: UCX says its KV protocols are intra-node, so no NIC could carry
    # the KV cache and the NIC cross-check says why it was not made (test_kv_link.py: real ports)
    assert {p["scope"] for p in v["summary"]["kv_protocols"]} == {"intra-node"}, v["summary"]
    link = rec["kv"]["link"]
    assert link["verdict"] == "unverified" and "both nodes are this host" in link["message"], link


def test_no_engine_is_left(job):
    assert subprocess.run(["pgrep", "-f", str(job[6])], capture_output=True, text=True).stdout.split() == []


def test_one_node_is_refused_in_one_line(tmp_path_factory):
    """vllm-pd needs exactly two nodes; the batch file says so before anything starts. (A short
    root: slurmd's step sockets live under it, and a Unix socket path has at most 108 bytes; under
    xdist this test's own tmp_path made one of 110, slurmd could not start the job, and Slurm
    requeued it for ever.)"""
    tmp_path = tmp_path_factory.mktemp("pd1")
    with SlurmCluster(tmp_path, nodes=1) as c:
        env = c.env(child_env(FB_ENGINE="vllm-pd", FB_MODEL_PATH="/models/m"))
        r = subprocess.run(["sbatch", "--wait", "--nodes=1", f"--output={tmp_path}/bad-%j.out", "--time=2",
                            "launch/slurm/inference.sbatch", "fabric=loopback"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    (out,) = tmp_path.glob("bad-*.out")
    assert out.read_text().strip().endswith(
        "error: FB_ENGINE=vllm-pd runs prefill on node 0 and decode on node 1: sbatch --nodes=2, not 1")
