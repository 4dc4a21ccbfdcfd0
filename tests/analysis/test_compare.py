"""Which way is better, how the verdict words it, and the collectives headlines and chart
series. Synthetic records with hand-chosen values (the statistics themselves are pinned in
tests/analysis/test_stats.py)."""

from __future__ import annotations

import pytest

from analysis.compare import compare_table, direction, headline
from analysis.load import Table, run_from_record
from analysis.plots import groups
from helpers.records import coll, train
from workloads.commands.cli import main as cli_main
from workloads.core.errors import UsageError
from workloads.core.records import write_record

COMM = {"roce": [0.30, 0.31, 0.29, 0.305], "ib": [0.20, 0.21, 0.19, 0.205]}


def test_comm_share_lower_is_better_and_is_not_speed():
    t = Table(run_from_record(train(f, i, comm_share=v)) for f, vals in COMM.items() for i, v in enumerate(vals))
    (( _, c),) = compare_table(t, baseline="ib", metrics=["comm_share"]).comparisons
    # medians 0.3025 (roce) vs 0.2025 (ib): ib spends a third less of its step communicating (geometric
    # means: 33.2%), its own change, not "49.4% better" (a ratio of shares read as a speed)
    assert c.fabric == "roce" and c.significant and c.speedup < 1
    assert c.verdict.startswith("ib's comm_share is 33.2% lower than roce's"), c.verdict
    assert "faster" not in c.verdict


@pytest.mark.parametrize("metric, hib, word", [
    ("comm_share", False, "better"), ("duration", False, "faster"), ("failed", False, "better"),
    ("warmup_failed", False, "better"), ("final_loss", False, "better"), ("iteration_time(s)", False, "faster"),
    ("p90_ttft_ms", False, "faster"), ("p99_send_lag_ms", False, "better"), ("p2p_min_latency(us)", False, "faster"),
    ("samples_per_sec", True, "faster"), ("request_throughput", True, "faster"), ("mfu", True, "better"),
    ("all_reduce/avg_busbw(GB/s)", True, "faster"), ("p2p_peak_bw(MB/s)", True, "faster"),
    # declared by their workloads (workloads/*/declare.py): the same answers as the table they left
    ("iteration_time_std(s)", False, "better"), ("mean_send_lag_ms", False, "better"), ("kv_xfer_ms_mean", False, "faster"),
    ("kv_ttft_share", False, "better"), ("routing_skew_max", False, "better"), ("request_goodput", True, "faster"),
    ("tflops_per_gpu", True, "faster"), ("completed", True, "better"), ("alltoall_share", False, "better"),
    ("reverse/retransmits", False, "better"), ("wrong_elements", False, "better"), ("throughput(%line)", True, "better"),
    ("comm_time_per_step(s)", False, "faster"), ("loss", False, "better"),
])
def test_direction_registry(metric, hib, word):
    assert direction(metric) == (hib, word)


def test_counts_are_the_declared_ones():
    from analysis.compare import counted

    assert [m for m in ("retransmits", "failed", "warmup_failed", "wrong_elements", "rows_with_wrong", "completed",
                        "comm_share", "duration") if counted(m)] == \
        ["retransmits", "failed", "warmup_failed", "wrong_elements", "rows_with_wrong"]


def test_unknown_metric_is_refused_not_guessed(tmp_path, capsys):
    for i, f in enumerate(("ib", "roce")):
        write_record(tmp_path / f / "records", train(f, i, measured_steps=20), f"pretrain-{f}")
    with pytest.raises(UsageError, match="measured_steps: no known direction"):
        compare_table(Table(), metrics=["measured_steps"])
    assert cli_main(["compare", str(tmp_path), "--metric", "measured_steps"]) == 2
    assert "declare it in its workload's METRICS" in capsys.readouterr().err


def test_collectives_headlines_are_per_op_and_the_primary_is_all_reduce_at_the_largest_size():
    t = Table(run_from_record(coll(f, i, busbw=40.0 if f == "ib" else 30.0)) for f in ("ib", "roce") for i in range(2))
    res = compare_table(t, baseline="ib")
    by = {c.metric: c for _, c in res.comparisons}
    assert sorted(by) == ["all_reduce/avg_busbw(GB/s)", "all_reduce/busbw@1048576(GB/s)", "alltoall/avg_busbw(GB/s)"]
    # one decision per workload: all_reduce at 1 MiB (the mean of its two placements: 40 and 40.8)
    assert [m for m, c in by.items() if c.primary] == ["all_reduce/busbw@1048576(GB/s)"]
    assert by["all_reduce/busbw@1048576(GB/s)"].median_base == pytest.approx(40.4)
    assert by["alltoall/avg_busbw(GB/s)"].correction == "bh"  # exploratory: a family of its own
    ar = by["all_reduce/avg_busbw(GB/s)"]
    assert ar.median == 30.0 and ar.median_base == 40.0 and ar.ratio == pytest.approx(0.75)
    assert headline("collectives", ["avg_busbw(GB/s)", "x/avg_busbw(GB/s)", "peak_busbw(GB/s)"]) == ["x/avg_busbw(GB/s)"]


def test_busbw_charts_split_by_world_size_and_dtype_where_they_differ():
    """8 and 16 ranks, or float and bfloat16, are different curves, never trials of one:
    the charts group runs by the guard's identity (analysis/plots.groups)."""
    (one,) = groups(Table([run_from_record(coll("ib", 0)), run_from_record(coll("roce", 0))]))
    assert one[0] == "" and {r.fabric for r in one[1]} == {"ib", "roce"}  # one group, nothing to tell apart
    t = Table(run_from_record(r) for r in (coll("ib", 0, world=8), coll("ib", 0, world=16, busbw=80.0),
                                           coll("ib", 0, world=16, dtype="bfloat16", busbw=90.0)))
    labels = [label for label, _ in groups(t)]
    assert len(labels) == 3 and all("world.world_size=" in x or "datatype=" in x for x in labels), labels


def test_the_congestion_headline_names_what_the_noise_measured():
    """The median of what the noise did at each of the arm's points: iperf3's Mbit/s, or a CPU
    hog's cores busy (three points: 0.8, 1.9, 1.2 cores -> median 1.20)."""
    from types import SimpleNamespace

    from analysis.summary import _noise_measured

    hogs = [SimpleNamespace(noise={"during_point": {"cpu_s": c, "seconds": 1.0, "cores_busy": c}}) for c in (0.8, 1.9, 1.2)]
    assert _noise_measured(hogs) == ", median 1.20 cores busy"
    flows = [SimpleNamespace(noise={"during_point": {"bytes": 1, "seconds": 1.0, "throughput(Mbit/s)": m}}) for m in (48.9, 50.0)]
    assert _noise_measured(flows) == ", median 50.0 Mbit/s of it"  # upper median of two, as before
    assert _noise_measured([SimpleNamespace(noise={"during_point": None})]) == ""
