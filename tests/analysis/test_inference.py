"""Inference analysis: load points, the guard across run directories, capacity at an SLO.

The records are synthetic (no GPU serving engine runs here), written with the real record
writer in the layout workloads/inference/run.py gives them: `point`, `arrival.*`,
`server.{adapter,tp,nnodes,url,argv,log}`, vLLM metric names; server.argv is the real
reference adapter's command line, which names the fabric. The numbers are the reviewer's
example: roce 1-5% slower than ib at every level, p90 TTFT at c32 505 ms vs 480 ms
against a 500 ms bound.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from analysis import capacity, guard
from analysis.compare import compare_table
from analysis.load import Table, load_table, run_from_record
from analysis.report import write_report
from workloads.core.records import write_record
from workloads.inference.adapters.base import ServerSpec
from workloads.inference.adapters.reference import command

LEVELS = [1, 2, 4, 8, 16, 32, 64]
# p90 TTFT (ms) and request_throughput (req/s, both GPUs of tp=2) per closed-loop concurrency
IB_TTFT = {1: 80, 2: 90, 4: 110, 8: 150, 16: 250, 32: 480, 64: 2000}
IB_RPS = {1: 0.9, 2: 1.8, 4: 3.5, 8: 6.6, 16: 11.5, 32: 17.0, 64: 19.0}
ROCE_TTFT = {1: 81, 2: 91, 4: 111, 8: 152, 16: 255, 32: 505, 64: 2100}
ROCE_RPS = {1: 0.89, 2: 1.77, 4: 3.43, 8: 6.4, 16: 11.1, 32: 16.3, 64: 18.3}


def sweep_records(root: Path | None, fabric: str, ttft: dict, rps: dict, trial: int = 0, tp: int = 2,
                  nnodes: int = 1, adapter: str = "reference") -> list[dict]:
    """One sweep c1..c64 as sweep.py records it; written under root/<run_id>/records when root is given."""
    run_id = f"{fabric}-t{trial}"
    run_dir = (root or Path("/results")) / run_id
    spec = ServerSpec(adapter=adapter, tp=tp, nnodes=nnodes, port=8000, dist_init_addr="n0:5000" if nnodes > 1 else None)
    launch = command(spec, {"name": "neox-tiny"}, fabric)
    config = {"workload": {"name": "inference"}, "fabric": {"name": fabric, "env": {"NCCL_IB_HCA": fabric}},
              "model": {"name": "neox-tiny"}, "server": {"name": adapter, "tp": tp, "nnodes": nnodes, "port": 8000},
              "load": {"name": "concurrency_sweep", "arrival": "closed", "points": LEVELS, "rate": math.inf,
                       "num_requests": 256, "warmup_requests": 4, "dataset": {"input_len": 1024, "output_len": 128}},
              "run_id": run_id, "output_root": str(root), "seed": 1234, "trial": trial}
    out = []
    for c in LEVELS:
        rec = {"schema": "fabricbench.record/1", "workload": "inference", "status": "ok", "error": None,
               "point": f"c{c}", "run_id": run_id, "overrides": [f"fabric={fabric}", f"trial={trial}"], "config": config,
               "arrival": {"kind": "closed", "rate": math.inf, "burstiness": 1.0, "concurrency": c, "max_concurrency": None},
               "model": {"name": "neox-tiny"},
               "fabric": {"name": fabric, "backend": "nccl", "env": {"NCCL_IB_HCA": fabric}},
               "server": {"adapter": adapter, "tp": tp, "nnodes": nnodes, "url": spec.base_url, "argv": launch.argv,
                          "log": str(run_dir / "server" / f"{adapter}.log")},
               "fingerprint": {"hostname": f"{fabric}-node", "gpu": "NVIDIA H100", "gpu_count": 8, "torch": "2.5.0",
                               "git": {"commit": "abc"}},
               "metrics": {"p90_ttft_ms": ttft[c], "median_ttft_ms": 0.8 * ttft[c], "p99_ttft_ms": 1.2 * ttft[c],
                           "request_throughput": rps[c], "completed": 256, "failed": 0, "duration": 256 / rps[c]},
               "samples": {}}
        if root is not None:
            write_record(run_dir / "records", rec, f"inference-{fabric}-neox-tiny-{adapter}-tp{tp}-c{c}")
        out.append(rec)
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Two fabrics, two trials each, four separate run directories."""
    root = tmp_path_factory.mktemp("infer")
    for trial in (0, 1):
        sweep_records(root, "ib", IB_TTFT, IB_RPS, trial)
        sweep_records(root, "roce", ROCE_TTFT, ROCE_RPS, trial)
    return root, load_table([str(root)])


def test_sweep_points_are_compared_per_point_not_pooled(study):
    _, table = study
    assert len(table) == 28
    assert sorted(table.column("concurrency")[table.column("fabric") == "ib"]) == sorted(LEVELS * 2)
    assert table[0].coords["world_size"] == 2 and "rate" not in table[0].coords  # closed loop: rate inf is no coordinate
    res = compare_table(table, baseline="ib")
    assert res.refusals == []  # server.argv names the fabric, server.log the run directory: neither refuses
    assert len(res.points) == 7
    for p in res.points:  # each point: 2 ib + 2 roce trials at one concurrency, not the whole sweep
        assert sorted(r.fabric for r in p.runs) == ["ib", "ib", "roce", "roce"]
        assert len({r.point for r in p.runs}) == 1
    assert len(res.comparisons) == 7 * 3  # request_throughput, median and p99 TTFT at every point
    c32 = {c.metric: c for p, c in res.comparisons if p.runs[0].point == "c32"}
    assert c32["request_throughput"].median == pytest.approx(16.3) and c32["request_throughput"].median_base == pytest.approx(17.0)
    assert c32["p99_ttft_ms"].median == pytest.approx(1.2 * 505) and "n=2 vs 2" in c32["p99_ttft_ms"].verdict
    assert any(p.label.endswith(" c32") for p, _ in res.comparisons)


def test_guard_identity_holds_the_point_and_ignores_server_bookkeeping(tmp_path):
    a = sweep_records(tmp_path / "a", "ib", IB_TTFT, IB_RPS)
    b = sweep_records(tmp_path / "b", "roce", ROCE_TTFT, ROCE_RPS)
    assert a[5]["server"]["argv"] != b[5]["server"]["argv"] and a[5]["server"]["log"] != b[5]["server"]["log"]
    assert guard.check(a[5], b[5]) is None
    d = guard.differences(a[4], a[5])  # c16 vs c32 of one sweep: different points
    assert d["point"] == ("c16", "c32") and d["arrival.concurrency"] == (16, 32)
    other = sweep_records(None, "roce", ROCE_TTFT, ROCE_RPS, tp=4)
    assert "server.tp" in guard.differences(a[5], other[5])  # what was started still counts


def test_capacity_interpolates_in_req_per_gpu_and_brackets(study):
    _, table = study
    caps = {c.fabric: c for c in capacity.capacities(table, 500.0)}
    ib, roce = caps["ib"], caps["roce"]
    assert ib.gpus == roce.gpus == 2  # server.tp, not the fallback 1
    assert (roce.passed.label, roce.failed.label) == ("c16", "c32")
    assert (ib.passed.label, ib.failed.label) == ("c32", "c64")
    # roce: t = (500-255)/(505-255) = 0.98; 11.1 + 0.98 * (16.3-11.1) = 16.196 req/s -> 8.098 per GPU
    assert roce.capacity == pytest.approx(16.196) and roce.per_gpu == pytest.approx(8.098)
    assert roce.crossing == pytest.approx(16 + 0.98 * 16)
    # ib: t = 20/1520; 17 + 2/76 = 17.0263 req/s -> 8.5132 per GPU
    assert ib.capacity == pytest.approx(17 + 2 / 76) and ib.per_gpu == pytest.approx((17 + 2 / 76) / 2)
    assert roce.bracket_per_gpu == pytest.approx((5.55, 8.15)) and ib.bracket_per_gpu == pytest.approx((8.5, 9.5))
    (line,) = capacity.gpu_verdicts(list(caps.values()), "ib", 500.0)
    # the brackets separate (8.15 < 8.5): 8.5132/8.098 - 1 = 5.1%; bounds 8.5/8.15-1 = 4.3%, 9.5/5.55-1 = 71%
    assert "roce needs 5% more GPUs than ib" in line and "4% to 71%" in line
    assert "100%" not in line and "between c16 and c32 vs between c32 and c64" in line


def test_capacity_overlapping_brackets_state_no_percentage():
    roce_ttft = ROCE_TTFT | {32: 495}  # both now cross between c32 and c64
    t = Table(run_from_record(r) for r in sweep_records(None, "ib", IB_TTFT, IB_RPS) + sweep_records(None, "roce", roce_ttft, ROCE_RPS))
    caps = capacity.capacities(t, 500.0)
    (line,) = capacity.gpu_verdicts(caps, "ib", 500.0)
    assert "cannot tell roce and ib apart" in line and "%" not in line
    assert "between c32 and c64 (8.15-9.15 req/s per GPU)" in line


def test_capacity_open_bracket_gives_a_lower_bound_only():
    ib_ttft = IB_TTFT | {64: 450}  # ib meets the SLO at every level: capacity >= 19 req/s
    t = Table(run_from_record(r) for r in sweep_records(None, "ib", ib_ttft, IB_RPS) + sweep_records(None, "roce", ROCE_TTFT, ROCE_RPS))
    caps = {c.fabric: c for c in capacity.capacities(t, 500.0)}
    assert caps["ib"].capacity is None and caps["ib"].bracket_per_gpu == (9.5, math.inf)
    (line,) = capacity.gpu_verdicts(list(caps.values()), "ib", 500.0)
    assert "roce needs at least 17% more GPUs than ib" in line  # 9.5 / 8.15 - 1 = 16.6%
    assert "above c64 (every level passed)" in line


def test_capacity_gpus_are_the_total_tp_degree_on_multi_node_servers():
    # SGLang --tp 16 --nnodes 2: 16 GPUs over two nodes (the degree is the total), not 32
    t = Table(run_from_record(r) for r in sweep_records(None, "ib", IB_TTFT, IB_RPS, tp=16, nnodes=2, adapter="sglang"))
    (cap,) = capacity.capacities(t, 500.0)
    assert cap.gpus == 16 and cap.per_gpu == pytest.approx((17 + 2 / 76) / 16)
    assert "2 nodes" in cap.sweep and "tp16" in cap.sweep


def test_report_states_capacity_brackets_and_draws_inference_plots(study, tmp_path):
    _, table = study
    rep = write_report(table, compare_table(table, baseline="ib"), tmp_path / "rep", slo_ms=500.0)
    md = rep.markdown.read_text()
    cap = md[md.index("## Capacity"):md.index("## Method")]
    assert "roce neox-tiny reference tp2 closed loop: TTFT p90 crosses 500 ms between c16 (255 ms, 11.1 req/s) and c32" in cap
    assert "= 8.098 req/s per GPU on 2 GPUs" in cap
    assert "roce needs 5% more GPUs than ib" in cap and "100%" not in cap
    # one sweep: the latency/load chart (SLO line, latency-throughput) and the capacity bars
    assert {p.stem for p in rep.images} == {"inference_0", "capacity_0"}
    assert "SLO 500 ms" in (tmp_path / "rep" / "plots" / "inference_0.svg").read_text()
