"""Collective formulas and pure pieces, pinned with hand-computed values (no processes).

algbw = S / t and busbw = algbw x factor(n), GB/s = 1e9 B/s (docs/metrics.md, nccl-tests'
doc/PERFORMANCE.md). Every case below uses S = 12,000,000 B and t = 4 ms, so
algbw = 12e6 / 0.004 / 1e9 = 3.0 GB/s.
"""

import pytest
import torch

from helpers import run_entry
from helpers.collectives import settings as _settings
from workloads.collectives import ops
from workloads.collectives.harness import (
    Cell,
    Row,
    count_wrong,
    format_row,
    min_bw_verdict,
    summarize,
)
from workloads.collectives.settings import (
    float_str,
    parse_size,
    pattern_groups,
    sweep_sizes,
)
from workloads.core.errors import UsageError

S, T = 12_000_000, 0.004
# busbw by hand: all_reduce 3.0 x 2(n-1)/n -> n=2: 3.0, n=3: 3.0 x 4/3 = 4.0, n=4: 3.0 x 6/4 = 4.5
#                all_gather/reduce_scatter/alltoall 3.0 x (n-1)/n -> 1.5, 2.0, 2.25
#                broadcast/reduce/sendrecv 3.0 x 1
BUSBW = {
    "all_reduce": {2: 3.0, 3: 4.0, 4: 4.5},
    "all_gather": {2: 1.5, 3: 2.0, 4: 2.25},
    "reduce_scatter": {2: 1.5, 3: 2.0, 4: 2.25},
    "alltoall": {2: 1.5, 3: 2.0, 4: 2.25},
    **{f"alltoallv_{k}": {2: 1.5, 3: 2.0, 4: 2.25} for k in ("uniform", "zipf", "hot")},  # as alltoall
    "broadcast": {2: 3.0, 3: 3.0, 4: 3.0},
    "reduce": {2: 3.0, 3: 3.0, 4: 3.0},
    "sendrecv": {2: 3.0, 3: 3.0, 4: 3.0},
}


@pytest.mark.parametrize("name", sorted(BUSBW))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_algbw_busbw_every_op(name, n):
    algbw, busbw = ops.get(name).bandwidth(S, T, n)
    assert algbw == pytest.approx(3.0, rel=1e-12)
    assert busbw == pytest.approx(BUSBW[name][n], rel=1e-12)


def test_registry_has_exactly_the_issue_ops_and_aliases():
    assert set(ops.REGISTRY) == set(BUSBW)
    assert ops.get("allreduce").name == "all_reduce" and ops.get("all_to_all").name == "alltoall"
    with pytest.raises(UsageError, match="unknown op 'allreduse'"):
        ops.get("allreduse")


@pytest.mark.parametrize("name,nbytes,elt,n,size,count", [
    # the size column is max(send, recv) bytes after nccl-tests' rounding
    ("all_reduce", 1000, 4, 3, 1000, 250),
    ("broadcast", 1001, 4, 3, 1000, 250),  # 1001 B is 250 floats
    ("all_gather", 1000, 4, 3, 960, 80),  # 250 // 3 = 83 per rank, down to a 16-B multiple (4 floats): 80; 80*3*4
    ("reduce_scatter", 1000, 4, 3, 960, 80),
    ("all_gather", 100, 1, 2, 96, 48),  # int8: 50 per rank -> 48 (16-B multiple); 48*2
    ("alltoall", 1000, 4, 3, 996, 83),  # 83 per peer, no alignment; 83*3*4
    ("sendrecv", 1000, 4, 3, 1000, 250),
])
def test_size_rounding_as_nccl_tests(name, nbytes, elt, n, size, count):
    lay = ops.get(name).layout(nbytes, elt, n)
    assert (lay.size, lay.count) == (size, count)


def test_sweep_sizes_factor_and_fixed_step_and_errors():
    assert sweep_sizes(8, 64, None, 2) == [8, 16, 32, 64]
    assert sweep_sizes(8, 100, None, 2) == [8, 16, 32, 64]  # max is an upper bound
    assert sweep_sizes(100, 400, 100, None) == [100, 200, 300, 400]
    assert sweep_sizes(5, 5, None, None) == [5]
    with pytest.raises(UsageError, match="out of order"):
        sweep_sizes(64, 8, None, 2)
    with pytest.raises(UsageError, match="only one of"):
        sweep_sizes(8, 64, 8, 2)


def test_parse_size_binary_units():
    assert parse_size("32M", "k") == 32 * 1024 * 1024
    assert parse_size("1K", "k") == 1024 and parse_size(4096, "k") == 4096 and parse_size("2GiB", "k") == 2 << 30
    with pytest.raises(UsageError, match="collectives.maxbytes='lots' is not a size"):
        parse_size("lots", "collectives.maxbytes")


def test_float_str_matches_nccl_tests_columns():
    assert float_str(1234.5, 7) == "1234.50"
    assert float_str(12345.6, 7) == "12345.6"
    assert float_str(123456.0, 7) == " 123456"
    assert float_str(0.004, 6) == "  0.00"
    assert float_str(369.86, 6) == "369.86"


def test_traffic_patterns_split_like_nccl_tests():
    assert pattern_groups("all", 4, 2) == [[0, 1, 2, 3]]
    # NCCL_TESTS_SPLIT="MOD 2" on 2 nodes x 2: color = rank % 2 -> one rank per node per group
    assert pattern_groups("one_per_node", 4, 2) == [[0, 2], [1, 3]]
    assert pattern_groups("one_per_node", 16, 8)[3] == [3, 11]
    assert pattern_groups("pairs", 6, 3) == [[0, 3], [1, 4], [2, 5]]
    with pytest.raises(UsageError, match="needs 2 or more nodes"):
        pattern_groups("one_per_node", 4, 4)
    with pytest.raises(UsageError, match="even world size"):
        pattern_groups("pairs", 3, 3)


def test_settings_from_the_real_yaml_and_bad_input():
    s = _settings("collectives.ops=all", "collectives.maxbytes=1M")
    assert s.sweep.ops == tuple(ops.REGISTRY) and max(s.sweep.sizes) == 1 << 20 and s.timing.average == "mean"
    for bad, msg in [("collectives.datatype=float8", "datatype='float8' is unknown"),
                     ("collectives.op=mean", "op='mean' is unknown"),
                     ("collectives.ops=[all_reduce,gossip]", "unknown op 'gossip'"),
                     ("collectives.minbytes=64M", "out of order"),
                     ("collectives.average=median", "average='median'"),
                     ("collectives.iters=0", "iters must be positive")]:
        with pytest.raises(UsageError, match=msg):
            _settings(bad)
    with pytest.raises(UsageError, match="two different ranks"):
        _settings("collectives.p2p=[latency]", "collectives.p2p_ranks=[1,1]")


def test_check_counts_wrong_elements_exactly():
    want = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert count_wrong(want.clone(), want) == 0
    got = want.clone()
    got[2] += 1
    assert count_wrong(got, want) == 1
    assert count_wrong(torch.tensor([1, 5], dtype=torch.int8), torch.tensor([1, 4], dtype=torch.int8)) == 1
    # int8 products wrap the same way on the device and in the reference
    parts = [torch.full((2,), 3, dtype=torch.int8) for _ in range(6)]
    assert ops.reduce_reference(parts, "prod", torch.int8).tolist() == [(3**6) % 256 - 256] * 2


def test_footer_average_is_mean_busbw_of_every_reported_cell_and_min_bw_rule():
    c = lambda bus, wrong=0: Cell(1.0, bus, bus, wrong)  # noqa: E731
    rows = [Row("all_reduce", 8, 8, 2, "float", "sum", -1, 2, None, c(1.0)),
            Row("all_gather", 8, 8, 1, "float", "none", -1, 2, c(2.0), c(4.0, 1))]
    summary = summarize(rows)
    assert summary["avg_busbw"] == pytest.approx(7.0 / 3)  # N/A cells are not reported
    assert summary["rows_with_wrong"] == 1 and summary["wrong_elements"] == 1
    # NCCL_TESTS_MIN_BW: fail only below 0.9 x the minimum
    assert min_bw_verdict(9.1, 10.0) == "OK" and min_bw_verdict(8.9, 10.0) == "FAILED" and min_bw_verdict(1, None) == ""
    assert format_row(rows[0]).split()[:10] == ["8", "2", "float", "sum", "-1", "N/A", "N/A", "N/A", "N/A", "1.00"]


@pytest.mark.slow
def test_sizes_out_of_order_on_the_command_line_is_one_message(out_root):
    r = run_entry("collectives.py", f"output_root={out_root}", "collectives.minbytes=1M", "collectives.maxbytes=1K",
                  timeout=120)
    assert r.returncode == 2
    assert "error: collectives.minbytes (1048576) > collectives.maxbytes (1024): sizes are out of order" in r.stderr
    assert "Traceback" not in r.stderr


def test_count0_rows_are_reported_at_busbw_0_and_averaged_as_nccl_tests():
    """n=8 float all_gather, -b 8 -e 32M -f 2: 23 sizes. A rank's chunk is (bytes/4 // 8)
    floats rounded down to 4 (16 B), so 8, 16, 32 and 64 B are count 0 (128 B is the first
    with 4 floats per rank). nccl-tests' TimeTest still runs BenchTime on them in both
    placements (bw[0] += 0, bw_count[0]++). The measurement itself is replaced here (8 ranks
    of real collectives are the run tests' job): every measured cell reports 1.0 GB/s, so
    the footer must be 19 x 2 x 1.0 / (23 x 2) = 38/46 = 0.826087, not 1.0 (the skipped-row
    average, 46/38 = 1.21 x nccl-tests' as the review found)."""
    from workloads.collectives.harness import Harness

    s = _settings("collectives.ops=[all_gather]", "collectives.minbytes=8", "collectives.maxbytes=32M",
                  "collectives.warmup_iters=0", world=8)
    assert len(s.sweep.sizes) == 23
    comm = ops.Comm(group=None, rank=0, size=8, global_ranks=tuple(range(8)))
    lines: list[str] = []
    h = Harness(s.sweep, s.timing, s.checks, comm, torch.device("cpu"), "gloo", 0, lines.append)
    measured = []
    h.measure = lambda op, lay, place: measured.append(lay.size) or Cell(2.0, 1.0, 1.0, 0)
    rows = h.run_op(ops.get("all_gather"))
    assert [r.requested for r in rows] == list(s.sweep.sizes)  # no size skipped
    zero = [r for r in rows if r.count == 0]
    assert [r.requested for r in zero] == [8, 16, 32, 64] and all(r.size == 0 for r in zero)
    assert all(c.busbw == 0.0 and c.algbw == 0.0 and c.time_us is None and c.wrong == 0
               for r in zero for c in r.cells())
    assert 0 not in measured and len(measured) == 19 * 2  # a count-0 call is never made
    assert summarize(rows)["avg_busbw"] == pytest.approx(38 / 46) and summarize(rows)["cells"] == 46
    # printed like nccl-tests' count-0 line (time N/A: not called), and the footer agrees
    table = [ln for ln in lines if not ln.startswith("#")]
    assert len(table) == 23
    assert table[0].split() == ["0", "0", "float", "none", "-1", "N/A", "0.00", "0.00", "0",
                                "N/A", "0.00", "0.00", "0"]
    assert "# Avg bus bandwidth    : 0.826087 " in lines
    assert any("4 size(s) up to 64 B hold no whole float chunk per rank" in ln for ln in lines)


def test_headline_metrics_per_op_cross_op_and_min_bw_per_op():
    from workloads.collectives.run import below_min_busbw, metrics

    c = lambda bus: Cell(1.0, bus, bus, 0)  # noqa: E731
    rows = [Row("all_reduce", 8, 8, 2, "float", "sum", -1, 2, None, c(10.0)),
            Row("all_reduce", 16, 16, 4, "float", "sum", -1, 2, None, c(20.0)),
            Row("alltoall", 0, 8, 0, "float", "none", -1, 2, c(0.0), None),  # a count-0 row
            Row("alltoall", 16, 16, 2, "float", "none", -1, 2, c(4.0), None)]
    m = metrics(rows, ("all_reduce", "alltoall"))
    assert m["all_reduce/avg_busbw(GB/s)"] == pytest.approx(15.0)  # (10 + 20) / 2
    assert m["alltoall/avg_busbw(GB/s)"] == pytest.approx(2.0)  # (0 + 4) / 2: the count-0 row counts
    assert m["avg_busbw(GB/s)"] == pytest.approx(34 / 4) and m["measurements"] == 4  # every cell of every op
    # NCCL_TESTS_MIN_BW per op: min 10 -> threshold 9: all_reduce 15 passes, alltoall 2 fails,
    # although the blend (8.5) would fail both and a min of 9 (threshold 8.1) would pass both
    assert below_min_busbw(rows, ("all_reduce", "alltoall"), 10.0) == [("alltoall", pytest.approx(2.0))]
    assert below_min_busbw(rows, ("all_reduce", "alltoall"), 2.0) == []
    assert below_min_busbw(rows, ("all_reduce", "alltoall"), None) == []
