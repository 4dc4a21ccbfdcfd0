"""server=vllm-pd on two real Slurm nodes: launch/slurm/inference.sbatch with FB_ENGINE=vllm-pd on
the private one-machine Slurm (munged, slurmctld, two slurmd, both nodes at 127.0.0.1). Node 0 runs
launch/infer.py, which starts the prefill instance and the proxy and drives the load; node 1 runs
`python -m workloads.inference.worker`, which composes the same config and starts the decode
instance on FB_SERVE_PORT + 1, with its log in the job's shared run directory. The KV cache moves
between the two instances over NIXL/UCX (cma or tcp on one host: the loopback profile's
expectation; on a real cluster the profile names the RDMA transports instead).

ONE job, two vLLM start-ups (each engine in its API server's process, as conf/study/emu-pd.yaml
runs them: ~1-2 min on a 2-core machine), 3 requests plus a warm-up."""

from __future__ import annotations

import subprocess

import pytest

from helpers import REPO, child_env, records_in
from helpers.slurm_cluster import SlurmCluster, our_leftover_pids
from workloads.core.ports import quiet_ports

pytestmark = [pytest.mark.slow, pytest.mark.requires("root", "slurm"), pytest.mark.timeout(1500)]

REQUESTS = 3
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
             "server.kv_connector=NixlPushConnector",
             "server.extra_args=[--dtype,float32,--max-num-seqs,4,--enforce-eager,--distributed-executor-backend,uni]",
             "+server.env.VLLM_CPU_KVCACHE_SPACE=1", "+server.env.VLLM_ENABLE_V1_MULTIPROCESSING=0",
             "server.ready_timeout_s=900", "server.nixl_pthr_delay_us=1000", f"output_root={out}", "load.points=[1]", f"load.num_requests={REQUESTS}",
             "load.warmup_requests=1", "load.dataset.input_len=24", "load.dataset.output_len=4"],
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


def test_the_kv_cache_moved_and_its_path_is_verified(job):
    rec = job[2][0]
    kv = rec["kv"]
    assert kv["transfers"] > 0 and kv["failed"] == 0 and kv["bytes_per_transfer"] == BLOCK, kv
    assert kv["matches_model"] is True and kv["ttft_split_ms"]["requests"] == REQUESTS, kv
    v = rec["fabric"]["kv_path"]
    assert v["verdict"] == "ok" and v["expect"] == {"kv_transports": ["cma", "tcp"]}, v
    assert set(v["summary"]["kv_transports"]) <= {"cma", "tcp"}, v["summary"]
    # both "nodes" are this host: UCX says its KV protocols are intra-node, so no NIC could carry
    # the KV cache and the NIC cross-check says why it was not made (test_kv_link.py: real ports)
    assert {p["scope"] for p in v["summary"]["kv_protocols"]} == {"intra-node"}, v["summary"]
    link = kv["link"]
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
