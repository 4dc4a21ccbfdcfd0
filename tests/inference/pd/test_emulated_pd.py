"""server=vllm-pd across two emulated nodes (root), as a study: conf/study/emu-pd.yaml as a user
runs it. The prefill vLLM-CPU instance sits in node 0's network namespace and the decode instance
in node 1's, joined by a veth unshaped (emu-veth) or shaped to 100 Mbit/s (emu-100m), so every
request's KV cache crosses the link over UCX's tcp on emu0 (UCX_TLS=tcp, UCX_NET_DEVICES=emu0:
without them UCX would pick CMA between the two processes, which share this host, and no KV byte
would cross). Push connector (NixlPushConnector: the prefill instance WRITEs the blocks; pull
mode's GET over tcp stalled prefill legs for seconds on this box: docs/engines.md).

ONE study, 3 blocks ABBA = 6 runs of 6 requests, each run two vLLM start-ups (70-100 s each on a
2-core machine). The model is conf/model/llama-kv.yaml (128 KiB of fp32 KV a token): a 120-token
prompt moves one 128-token block, 16 MiB, which take 1.39 s at 100 Mbit/s against a prefill of
~250 ms, so the median-TTFT verdict is called on its own data, not assumed. Every run is also
checked as the single-run test checked it: requests completed, UCX's own protocol table says tcp
over emu0, and node 0's link counters moved at least the KV bytes the requests needed."""

from __future__ import annotations

import re
import subprocess
import sys
from statistics import median

import pytest

from helpers import REPO, child_env, emulations_left, records_in

# timing: its verdict compares TTFTs measured minutes apart, and at the default CPU weight beside
# the other workers one run in three came out inconclusive (a full run here: +458.9% [-27.1,
# +4185.8]), so it runs on the timed worker (8x the weight) with the other verdicts; in a second
# weighted group beside the timed one (tried 2026-11-28) its vLLM start-ups decided a training
# verdict there (emu-veth's CPU-bound runs at 89, 160 and 90 samples/s: inconclusive)
pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.requires("root"), pytest.mark.timeout(2400)]

REQUESTS, WARMUP = 6, 1
TRANSFER = 128 * 128 * 1024  # one 128-token block of llama-kv: 2 (K, V) x 4 layers x 16 heads x 256 x fp32 a token


@pytest.fixture(scope="module")
def study(vllm_python, kv_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("emu-pd") / "results"
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "study", "conf/study/emu-pd.yaml",
                        "--output-root", str(out)], cwd=REPO, env=child_env() | {"FB_PD_MODEL": str(kv_llama)},
                       capture_output=True, text=True, timeout=2200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    return out / "emu-pd", r, kv_llama


def test_study_calls_the_100mbit_link_slower_on_ttft_with_the_kv_transfer_time(study):
    out, r, _ = study
    verdicts = (out / "compare.txt").read_text()
    head = [ln for ln in verdicts.splitlines() if ln.startswith("headline: ")]
    assert len(head) == 1, verdicts
    assert head[0].startswith("headline: Inference, median TTFT") and "emu-veth is" in head[0], head
    # a latency is said as its own change: "x% lower", never a speed above 100%
    assert "lower than emu-100m [" in head[0] and "interleaved ABBA, 3 blocks" in head[0], head
    assert "inconclusive" not in head[0] and "not significant" not in head[0], head
    # the KV transfer time is compared as a metric of its own, and the study's table shows it per
    # arm beside the link's arithmetic
    assert re.search(r"\[kv_xfer_ms_mean\]: emu-veth's kv_xfer_ms_mean is \d+\.\d% lower than emu-100m's \[", verdicts), verdicts
    m = re.search(r"KV transfer, pd-16m c1 emu-100m: ([\d.]+) ms \(median over 3 runs of each run's mean\), (\d+)% of "
                  r"mean TTFT; the link's arithmetic: 16777216 B at 100mbit's TCP payload rate = 1403 ms, 1393 after "
                  r"tbf's burst", r.stdout)
    assert m and float(m[1]) >= 0.95 * 1393 and int(m[2]) > 50, r.stdout[-3000:]
    assert re.search(r"KV transfer, pd-16m c1 emu-veth: [\d.]+ ms \(median over 3 runs of each run's mean\), \d+% "
                     r"of mean TTFT\n", r.stdout), r.stdout[-3000:]
    recs = records_in(out)
    assert len(recs) == 6 and all(x["status"] == "ok" for x in recs), [x.get("error") for x in recs]
    xfer = {arm: [x["kv"]["xfer_ms_mean"] for x in recs if x["study"]["arm"] == arm] for arm in ("emu-veth", "emu-100m")}
    # the link's arithmetic beside the measurement: 16 MiB at 100 Mbit/s' TCP payload rate, less
    # tbf's 128 KiB burst; what a busy CPU adds can only lengthen a transfer
    for x in recs:
        if x["study"]["arm"] == "emu-100m":
            link = x["kv"]["link"]
            assert link["rate"] == "100mbit" and link["predicted_xfer_ms"] == pytest.approx(1403.354, abs=1e-3)
            assert link["predicted_xfer_ms_after_burst"] == pytest.approx(1392.868, abs=1e-3)
            assert 0.95 * link["predicted_xfer_ms_after_burst"] <= x["kv"]["xfer_ms_mean"], x["kv"]
        else:
            assert "predicted_xfer_ms" not in x["kv"]["link"], x["kv"]["link"]
    assert max(xfer["emu-veth"]) < min(xfer["emu-100m"]) / 3, xfer
    # the KV transfer's share of TTFT grows as the link slows
    share = {arm: median(x["metrics"]["kv_ttft_share"] for x in recs if x["study"]["arm"] == arm) for arm in xfer}
    assert share["emu-100m"] > 2 * share["emu-veth"], share


def test_every_run_moved_its_kv_cache_over_the_link(study):
    out, r, model = study
    for rec in records_in(out):
        assert rec["metrics"]["completed"] == REQUESTS, rec.get("error")
        assert rec["server"]["nnodes"] == 2 and rec["server"]["url"].startswith("http://10.78.")  # the host link into node 0
        kv = rec["kv"]
        assert kv["transfers"] > 0 and kv["failed"] == 0 and kv["bytes_per_transfer"] == TRANSFER, kv
        assert kv["bytes_per_token"] == 128 * 1024 and kv["matches_model"] is True, kv
        # UCX's own protocol table in the prefill (writing) instance's log: tcp, over the emulated link only
        v = rec["fabric"]["kv_path"]
        assert v["verdict"] == "ok" and v["expect"] == {"kv_transports": ["tcp"], "kv_devices": ["emu0"]}, v
        assert v["summary"]["kv_transports"] == ["tcp"] and v["summary"]["kv_devices"] == ["emu0"], v["summary"]
        # node 0's emu0 (prefill -> decode) carried every KV byte of the point's requests (warm-up
        # included), plus headers
        link = kv["link"]
        assert link["interface"] == "emu0" and link["kv_bytes"] == (REQUESTS + WARMUP) * TRANSFER, link
        assert link["tx_bytes"] >= link["kv_bytes"] and link["verdict"] == "ok", link
    # this study's namespaces are gone (others' may exist on a shared machine), and so are its engines
    logs = [p.read_text() for p in sorted((out / "logs").glob("*.log"))]
    assert len(logs) == 6 and emulations_left(*logs) == []
    assert subprocess.run(["pgrep", "-f", str(model)], capture_output=True, text=True).stdout.split() == []
