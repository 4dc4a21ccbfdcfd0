"""Reading nccl-tests / rccl-tests results: the stdout table and the -J JSON report.

The samples below are written from nccl-tests' documented layout (src/util.cu's
writeResultHeader / writeBenchmarkLine* / writeResultFooter: size, count, type, redop,
root, then time algbw busbw #wrong out-of-place and in-place; `N/A` where unchecked;
footer `# Avg bus bandwidth    : %g`), not copied from a run.
"""

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from helpers import HELPERS
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
    from helpers.collectives import settings as _settings

    s = _settings("collectives.minbytes=1M", "collectives.maxbytes=8M", "collectives.datatype=bfloat16",
                  "collectives.average=max", "collectives.iters=50")
    cmd = nccltests.build_command("all_reduce_perf", s.sweep, s.timing, s.checks, 8, tmp_path / "r.json")
    assert cmd[:7] == ["all_reduce_perf", "-b", "1048576", "-e", "8388608", "-f", "2"]
    flags = dict(zip(cmd[7::2], cmd[8::2]))
    assert flags == {"-n": "50", "-w": "5", "-d": "bfloat16", "-o": "sum", "-r": "0", "-c": "1", "-a": "3",
                     "-g": "8", "-J": str(tmp_path / "r.json")}
    fixed = _settings("collectives.minbytes=1K", "collectives.maxbytes=4K", "collectives.stepfactor=null",
                      "collectives.stepbytes=1K")
    assert nccltests.build_command("x", fixed.sweep, fixed.timing, fixed.checks, 1, None)[5:9] == ["-f", "1", "-i", "1024"]


def test_run_external_prefers_the_json_report(tmp_path, monkeypatch):
    # all_reduce_perf needs a GPU, so here a stand-in script plays it at that boundary: it
    # answers -h with the -J flag, prints TABLE and writes REPORT where -J points.
    from helpers.collectives import settings as _settings

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
    from helpers.collectives import settings as _settings

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


def _nccl_tests_on_path(tmp_path, monkeypatch) -> Path:
    """`all_reduce_perf` and `mpirun` shims running tests/helpers/nccl_tests_emulator.py, which
    reproduces how nccl-tests colours processes and numbers ranks (its docstring cites the
    lines); each run's argv is appended to bindir/argv."""
    import os
    import sys

    emulator = HELPERS / "nccl_tests_emulator.py"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, role in (("all_reduce_perf", "perf"), ("mpirun", "mpirun")):
        (bindir / name).write_text(f'#!/bin/sh\nexec {sys.executable} {emulator} {role} "$@"\n')
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCCL_TESTS_ARGV", str(bindir / "argv"))
    return bindir


def _plan(tmp_path, pattern, world, rpn, prefix=None):
    from helpers.collectives import settings as _settings
    from workloads.collectives import nccltests
    from workloads.core.dist import DistInfo

    over = ["collectives.minbytes=1M", "collectives.maxbytes=2M", f"collectives.pattern={pattern}"]
    if prefix is not None:
        over.append("collectives.external_prefix=[" + ",".join(f"'{a}'" for a in prefix) + "]")
    s = _settings(*over, world=world)
    return nccltests.run_planned(s, tmp_path / "ext", DistInfo(0, world, 0, rpn, "nccl", torch.device("cpu")), rpn)


def test_split_external_run_is_one_process_per_gpu_and_measures_our_groups(tmp_path, monkeypatch):
    """2 nodes x 8 GPUs, pattern=one_per_node: nccl-tests colours MPI processes (common.cu
    run(): color = proc % 8), so only -g 1 under a launcher of {world} processes gives our 8
    communicators of one rank per node; the record keeps the groups the binary printed."""
    from workloads.collectives.settings import pattern_groups

    bindir = _nccl_tests_on_path(tmp_path, monkeypatch)
    block = _plan(tmp_path, "one_per_node", 16, 8, ["mpirun", "-np", "{world}", "-N", "{ranks_per_node}"])
    assert block["status"] == "ok", block.get("reason")
    assert block["command"][:5] == ["mpirun", "-np", "16", "-N", "8"] and block["gpus"] == 1
    assert block["env"] == {"NCCL_TESTS_SPLIT": "MOD 8"} and block["scope"] == "job"
    assert block["groups"] == pattern_groups("one_per_node", 16, 8) and block["groups"][3] == [3, 11]
    assert (bindir / "argv").read_text().split()[-2:] == ["-g", "1"]


def test_external_run_that_measured_other_communicators_is_failed_not_recorded_as_ours(tmp_path, monkeypatch):
    """The layout the old docs gave (one process per node driving its 8 GPUs): every GPU of
    a process shares its colour, so "MOD 8" makes each node its own NVLink communicator."""
    from workloads.collectives import nccltests

    _nccl_tests_on_path(tmp_path, monkeypatch)
    block = _plan(tmp_path, "one_per_node", 16, 8, ["mpirun", "-np", "{nodes}", "-N", "1"])
    assert block["status"] == "failed" and block["groups"] == [[0], [1]]  # -g 1 x 2 processes: 2 ranks
    assert block["rows"] == [] and block["avg_busbw"] is None  # its figures are not kept beside ours
    assert "one process per GPU" in block["reason"] and "[[0, 8], [1, 9], ... (8 groups)]" in block["reason"]
    line = nccltests.summary_line(block)
    assert line.startswith("# external ") and "failed: it measured communicators [[0], [1]]" in line
    assert "avg bus bandwidth" not in line


def test_split_pattern_without_a_launcher_is_not_run(tmp_path, monkeypatch):
    """One process cannot be split (there is no MPI_Comm_split without MPI processes): the
    binary would measure all local GPUs as one communicator under a split label."""
    bindir = _nccl_tests_on_path(tmp_path, monkeypatch)
    block = _plan(tmp_path, "pairs", 8, 8)
    assert block["status"] == "skipped" and "needs collectives.external_prefix" in block["reason"]
    assert not (bindir / "argv").exists()
    # pattern=all on one node needs no launcher: one process, -g <local ranks>, one group
    block = _plan(tmp_path, "all", 8, 8)
    assert block["status"] == "ok" and block["gpus"] == 8 and block["groups"] == [list(range(8))]


def test_external_prefix_placeholders_are_checked_with_the_settings():
    from helpers.collectives import settings as _settings
    from workloads.collectives.settings import launch_prefix
    from workloads.core.errors import UsageError

    assert launch_prefix(["srun", "-n", "{world}", "--ntasks-per-node={ranks_per_node}"], 16, 2, 8) == \
        ["srun", "-n", "16", "--ntasks-per-node=8"]
    with pytest.raises(UsageError, match="placeholder other than"):  # every rank, before the sweep
        _settings("collectives.external_prefix=[mpirun,-np,'{gpus}']")


def _external_rank(rank: int, tmp: str, path_env: str) -> None:
    import os
    import time

    import torch.distributed as dist

    from helpers.collectives import settings as _settings
    from workloads.collectives.nccltests import run_external_alone
    from workloads.core import dist as fdist
    from workloads.core.dist import DistInfo

    os.environ["PATH"] = path_env
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    s = _settings("collectives.minbytes=1M", "collectives.maxbytes=2M", "collectives.external=on")
    block = run_external_alone(s, Path(tmp) / "ext", DistInfo(rank, 2, rank, 2, "gloo", None), 2)
    Path(tmp, f"left.{rank}").write_text(repr(time.time()))
    if rank == 0:
        Path(tmp, "status").write_text(block["status"])
    fdist.end_group_and_exit()


@pytest.mark.slow
def test_other_ranks_wait_on_the_host_while_rank0_runs_the_binary(tmp_path):
    """Two real Gloo processes: rank 1 must not leave before rank 0's stand-in binary (it
    needs a GPU, so a script sleeps 1.5 s and stamps its end) has finished."""
    import os
    import sys

    import torch.multiprocessing as mp

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "all_reduce_perf"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "-h" ] && exit 0\nsleep 1.5\n'
                    f'python3 -c "import time; print(repr(time.time()))" > {bindir}/ended\n'
                    f'FAKE_NCCL_TESTS_ARGV={bindir}/argv exec {sys.executable} '
                    f'{HELPERS / "nccl_tests_emulator.py"} perf "$@"\n')
    fake.chmod(0o755)
    mp.spawn(_external_rank, args=(str(tmp_path), f"{bindir}{os.pathsep}{os.environ['PATH']}"), nprocs=2)
    assert (tmp_path / "status").read_text() == "ok"
    ended = float((bindir / "ended").read_text())
    assert float((tmp_path / "left.1").read_text()) >= ended


def test_external_binary_logs_beside_its_output_not_in_our_nccl_folder(tmp_path, monkeypatch):
    """Its tuning lines in <run dir>/nccl would be read as the algorithms behind OUR rows
    (linerate.algorithms_in). The stand-in binary (it needs a GPU) writes where NCCL would."""
    from helpers.collectives import settings as _settings
    from workloads.collectives import nccltests

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "all_reduce_perf"
    fake.write_text('#!/bin/sh\n[ "$1" = "-h" ] && exit 0\n'
                    'echo "NCCL INFO AllReduce: opCount 0 bytes 1048576 datatype 7 op 0 algorithm 1 protocol 2" '
                    '> "$(echo "$NCCL_DEBUG_FILE" | sed "s/%h/h/; s/%p/1/")"\n'
                    f'{sys.executable} {HELPERS / "nccl_tests_emulator.py"} perf "$@"\n')
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "nccl").mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(run_dir / "nccl" / "nccl.%h.%p.log"))
    monkeypatch.setenv("FAKE_NCCL_TESTS_ARGV", str(bindir / "argv"))
    block = nccltests.run_external(_settings("collectives.minbytes=1M", "collectives.maxbytes=2M"),
                                   run_dir / "external", 1)
    assert block["status"] == "ok" and block["nccl_log"] == str(run_dir / "external" / "nccl.%h.%p.log")
    assert list((run_dir / "nccl").iterdir()) == [] and (run_dir / "external" / "nccl.h.1.log").exists()
