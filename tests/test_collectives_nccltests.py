"""Reading nccl-tests / rccl-tests results: the stdout table and the -J JSON report.

The samples below are written from nccl-tests' documented layout (src/util.cu's
writeResultHeader / writeBenchmarkLine* / writeResultFooter: size, count, type, redop,
root, then time algbw busbw #wrong out-of-place and in-place; `N/A` where unchecked;
footer `# Avg bus bandwidth    : %g`), not copied from a run.
"""

import json
import os
import stat

import pytest

from workloads.collectives import nccltests
from workloads.collectives.harness import Cell, Row, format_row

TABLE = """\
# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 8 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  11 on      node1 device  0 [0000:18:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    42.10   24.91   43.59       0    41.80   25.09   43.90       0
     2097152        524288     float     sum      -1    55.00   38.13   66.73       0    54.90   38.20   66.85     N/A
     4194304       1048576     float     sum      -1  12345.6    0.34    0.59       3    80.00   52.43   91.75       0
# Out of bounds values : 1 FAILED
# Avg bus bandwidth    : 52.2350
#
# Collective test concluded: all_reduce_perf
"""

# An older binary (before redop/root columns), with -S 1 timestamps appended.
OLD_TABLE = """\
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
   33554432       8388608   float   1211.2   27.70   27.70  0e+00   1210.8   27.71   27.71  0e+00 2025-01-02 03:04:05
# Avg bus bandwidth    : 27.705
"""

REPORT = {
    "version": 2, "start_time": "2025-01-02 03:04:05", "args": ["all_reduce_perf", "-J", "x.json"], "env": [],
    "nccl_version": 22703,
    "config": {"nthreads": 1, "ngpus": 8, "minimum_bytes": 1048576, "maximum_bytes": 2097152, "step_factor": 2,
               "warmup_iters": 5, "iterations": 20},
    "results": [
        {"size": 1048576, "count": 262144, "type": "float", "redop": "sum", "root": "    -1",
         "out_of_place": {"time": 42.1, "alg_bw": 24.91, "bus_bw": 43.59, "nwrong": 0.0},
         "in_place": {"time": 41.8, "alg_bw": 25.09, "bus_bw": 43.9, "nwrong": None},
         "actual_iterations": 20, "experiment_name": "all_reduce_perf"},
        {"size": 2097152, "count": 524288, "type": "float", "redop": "sum", "root": "    -1",
         "out_of_place": {"time": 55.0, "alg_bw": 38.13, "bus_bw": 66.73, "nwrong": 0.0},
         "in_place": {"time": 54.9, "alg_bw": 38.2, "bus_bw": 66.85, "nwrong": 0.0},
         "actual_iterations": 20, "experiment_name": "all_reduce_perf"},
    ],
    "out_of_bounds": {"count": 0, "okay": "true"},
    "average_bus_bandwidth": {"bandwidth": 55.2675, "okay": "unchecked"},
    "errors": [], "end_time": "2025-01-02 03:04:09",
}


def test_parse_current_table():
    got = nccltests.parse_table(TABLE)
    assert got["avg_busbw"] == pytest.approx(52.235) and got["out_of_bounds"] == 1
    rows = got["rows"]
    assert [r["size"] for r in rows] == [1048576, 2097152, 4194304]
    first = rows[0]
    assert (first["op"], first["count"], first["type"], first["redop"], first["root"]) == \
        ("all_reduce", 262144, "float", "sum", -1)
    assert first["out_of_place"] == {"time_us": 42.10, "algbw": 24.91, "busbw": 43.59, "wrong": 0}
    assert first["in_place"]["busbw"] == 43.90
    assert rows[1]["in_place"]["wrong"] is None  # N/A
    assert rows[2]["out_of_place"]["time_us"] == 12345.6 and rows[2]["out_of_place"]["wrong"] == 3


def test_parse_old_table_with_timestamps():
    got = nccltests.parse_table(OLD_TABLE)
    (row,) = got["rows"]
    assert (row["size"], row["count"], row["type"], row["redop"], row["root"]) == (33554432, 8388608, "float", "none", -1)
    assert row["out_of_place"]["busbw"] == 27.70 and row["in_place"]["time_us"] == 1210.8
    assert row["in_place"]["wrong"] == 0 and got["avg_busbw"] == pytest.approx(27.705)


def test_parse_json_report():
    got = nccltests.parse_json(json.loads(json.dumps(REPORT)))
    assert got["avg_busbw"] == pytest.approx(55.2675) and got["out_of_bounds"] == 0
    a, b = got["rows"]
    assert (a["size"], a["count"], a["root"], a["redop"]) == (1048576, 262144, -1, "sum")
    assert a["out_of_place"] == {"time_us": 42.1, "algbw": 24.91, "busbw": 43.59, "wrong": 0}
    assert a["in_place"]["wrong"] is None and b["in_place"]["busbw"] == 66.85


def test_our_own_table_reads_back_with_the_same_parser():
    row = Row("all_gather", 960, 1000, 80, "float", "none", -1, 3, Cell(512.25, 0.00187, 0.00125, 0),
              Cell(1234.5, 0.0008, 0.0005, 1))
    (back,) = nccltests.parse_table(format_row(row), op="all_gather")["rows"]
    assert (back["size"], back["count"], back["type"], back["root"]) == (960, 80, "float", -1)
    assert back["out_of_place"]["time_us"] == 512.25 and back["in_place"]["wrong"] == 1


def test_build_command_maps_the_sweep_to_nccl_tests_flags(tmp_path):
    from tests.test_collectives_bw import _settings

    s = _settings("collectives.minbytes=1M", "collectives.maxbytes=8M", "collectives.datatype=bfloat16",
                  "collectives.average=max", "collectives.iters=50")
    cmd = nccltests.build_command("all_reduce_perf", s, 8, tmp_path / "r.json")
    assert cmd[:7] == ["all_reduce_perf", "-b", "1048576", "-e", "8388608", "-f", "2"]
    flags = dict(zip(cmd[7::2], cmd[8::2]))
    assert flags == {"-n": "50", "-w": "5", "-d": "bfloat16", "-o": "sum", "-r": "0", "-c": "1", "-a": "3",
                     "-g": "8", "-J": str(tmp_path / "r.json")}
    fixed = _settings("collectives.minbytes=1K", "collectives.maxbytes=4K", "collectives.stepfactor=null",
                      "collectives.stepbytes=1K")
    assert nccltests.build_command("x", fixed, 1, None)[5:9] == ["-f", "1", "-i", "1024"]


def test_run_external_prefers_the_json_report(tmp_path, monkeypatch):
    # all_reduce_perf needs a GPU, so here a stand-in script plays it at that boundary: it
    # answers -h with the -J flag, prints TABLE and writes REPORT where -J points.
    from tests.test_collectives_bw import _settings

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "table.txt").write_text(TABLE)
    (bindir / "report.json").write_text(json.dumps(REPORT))
    fake = bindir / "all_reduce_perf"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = "-h" ]; then echo "[-J,--output_file <file>]"; exit 0; fi
echo "$@" > {bindir}/argv
while [ $# -gt 1 ]; do if [ "$1" = "-J" ]; then cp {bindir}/report.json "$2"; fi; shift; done
cat {bindir}/table.txt
""")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    block = nccltests.run_external(_settings("collectives.minbytes=1M", "collectives.maxbytes=2M"), tmp_path / "ext", 8)
    assert block["status"] == "ok" and block["source"] == "json"
    assert block["avg_busbw"] == pytest.approx(55.2675) and len(block["rows"]) == 2
    assert "-J" in (bindir / "argv").read_text() and (tmp_path / "ext" / "all_reduce_perf.out").exists()


def test_external_run_without_prefix_on_two_nodes_is_labelled_intra_node(tmp_path, monkeypatch):
    # the same stand-in binary as above (all_reduce_perf needs a GPU), run as on rank 0 of
    # a 2-node job with 8 GPUs per node and no collectives.external_prefix
    from tests.test_collectives_bw import _settings

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "table.txt").write_text(TABLE)
    fake = bindir / "all_reduce_perf"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = \"-h\" ]; then exit 0; fi\ncat {bindir}/table.txt\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    s = _settings("collectives.minbytes=1M", "collectives.maxbytes=4M", world=16)
    block = nccltests.run_external(s, tmp_path / "ext", 8, nodes=2)
    assert block["status"] == "ok" and block["scope"] == "intra-node" and block["avg_busbw"] == pytest.approx(52.235)
    line = nccltests.summary_line(block)
    assert line.startswith(f"# external {fake}: avg bus bandwidth 52.235 GB/s (table) -- INTRA-NODE ONLY: ")
    assert "-g 8 on rank 0's node of a 2-node job" in line and "collectives.external_prefix" in line
    # a launcher prefix spreads it over the job; one node is the whole job anyway
    assert nccltests.external_scope(("mpirun", "-np", "2", "-N", "1"), 2) == "job"
    assert nccltests.external_scope((), 1) == "job" and nccltests.external_scope([], 2) == "intra-node"
    one_node = nccltests.run_external(s, tmp_path / "ext1", 8, nodes=1)
    assert one_node["scope"] == "job" and "INTRA-NODE" not in nccltests.summary_line(one_node)
