"""Checks every real-engine sweep shares (tests/test_engines_vllm.py, tests/inference/): a
record's metrics recomputed from its own per-request samples, by docs/metrics.md's definitions."""

from __future__ import annotations

import numpy as np
import pytest


def check_metrics_match_the_samples(recs: list[dict], requests: int, out_len: int) -> None:
    """Recomputed from record["samples"] with numpy; `requests` per point, `out_len` tokens each."""
    for x in recs:
        m, rows = x["metrics"], x["samples"]["requests"]
        assert len(rows) == requests and all(q["ok"] for q in rows)
        # ignore_eos + the server's usage: every request produced exactly what was asked.
        assert [q["output_tokens"] for q in rows] == [out_len] * requests
        assert {q["output_tokens_from"] for q in rows} == {"usage"}
        ttft = np.array([q["ttft_s"] for q in rows])
        lat = np.array([q["latency_s"] for q in rows])
        tpot = (lat - ttft) / (out_len - 1)
        itl = np.concatenate([q["itl_s"] for q in rows])
        assert m["completed"] == requests and m["failed"] == 0
        assert m["total_output_tokens"] == requests * out_len
        assert m["request_throughput"] == pytest.approx(requests / m["duration"], rel=1e-9)
        assert m["output_throughput"] == pytest.approx(requests * out_len / m["duration"], rel=1e-9)
        assert m["mean_ttft_ms"] == pytest.approx(ttft.mean() * 1e3, rel=1e-9)
        assert m["median_tpot_ms"] == pytest.approx(np.median(tpot) * 1e3, rel=1e-9)
        assert m["p99_e2el_ms"] == pytest.approx(np.percentile(lat, 99) * 1e3, rel=1e-9)
        assert m["median_itl_ms"] == pytest.approx(np.median(itl) * 1e3, rel=1e-9)
        # A streamed answer of out_len tokens has at most out_len - 1 gaps between content chunks,
        # and may have none: a server whose consumer lags merges its deltas into one chunk (vLLM
        # v1's RequestOutputCollector.put; stop 36's CI saw it on the P/D decode instance).
        assert all(len(q["itl_s"]) <= out_len - 1 for q in rows)
        # the gaps lie between the first content chunk (TTFT) and the last chunk with a choice (E2E)
        assert all(q["ttft_s"] + sum(q["itl_s"]) <= q["latency_s"] + 1e-9 for q in rows)
        # <=: a loaded box can deliver all of an answer's chunks in one read (ITL 0, E2E = TTFT).
        assert 0 < ttft.min() and (ttft <= lat).all() and m["duration"] >= lat.max()


def check_gloo_ranks_on_lo(transport: dict, tp: int) -> None:
    """A served sweep on fabric=loopback (+ NCCL_SOCKET_IFNAME=lo): verify.py's socket-table
    verdict from the server's own processes is ok, `tp` distinct rank processes, each with a
    Gloo connection on lo and the fabric's variables in its own environment."""
    assert transport["verdict"] == "ok", transport
    assert "/proc/<pid>" in transport["summary"]["how"]
    ranks = transport["summary"]["ranks"]
    assert len(ranks) == tp and len({r["pid"] for r in ranks}) == tp, ranks
    for r in ranks:
        assert r["peer_connections"] >= 1 and r["interfaces"] == ["lo"] and r["addresses"] == ["127.0.0.1"]
        assert r["env"] == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
