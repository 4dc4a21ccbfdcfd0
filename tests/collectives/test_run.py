"""Every collective end to end: real Gloo ranks over loopback at world size 2 and 3.

One launch per world size runs the whole op list (and, at 2, the point-to-point tests),
so the file stays fast. World 2 carries the test hook FABRICBENCH_TEST_CORRUPT=1:all_gather (environment, not config),
which adds 1 to one output element on rank 1: the check must count exactly that element
in both all_gather placements and nothing anywhere else, and the run must fail (exit 1)
with its record on disk.
"""

import re

import pytest

from helpers import child_env, records_in, run_entry
from workloads.collectives import ops
from workloads.collectives.settings import CORRUPT_ENV

SMALL = ["collectives.ops=all", "collectives.minbytes=1000", "collectives.maxbytes=16000", "collectives.stepfactor=16",
         "collectives.iters=3", "collectives.warmup_iters=1"]
PLACES = {"out_of_place", "in_place"}


def _check_row_arithmetic(row):
    op = ops.get(row["op"])
    n = row["group_size"]
    for place in PLACES:
        cell = row[place]
        if place not in op.placements:
            assert cell is None
            continue
        if row["count"] == 0:  # reported as nccl-tests does: 0 bytes moved, busbw 0, not called
            assert row["size"] == 0 and cell["busbw"] == cell["algbw"] == 0.0 and cell["time_us"] is None
            continue
        # the record's numbers recompute from its own size and time (docs/metrics.md)
        assert cell["algbw"] == pytest.approx(row["size"] / (cell["time_us"] * 1e-6) / 1e9, rel=1e-9)
        assert cell["busbw"] == pytest.approx(cell["algbw"] * op.bus_factor(n), rel=1e-9)


@pytest.mark.slow
def test_world2_every_op_counts_the_corrupted_element_and_runs_p2p(out_root):
    r = run_entry("collectives.py", f"output_root={out_root}", "launcher.nproc_per_node=2", *SMALL,
                  "collectives.p2p=[latency,bw,bibw]",
                  "collectives.p2p_minbytes=64", "collectives.p2p_maxbytes=4K", "collectives.p2p_iters=5",
                  "collectives.p2p_warmup=1", "collectives.p2p_window=4",
                  env=child_env(**{CORRUPT_ENV: "1:all_gather"}), timeout=400)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    (rec,) = records_in(out_root)
    assert rec["workload"] == "collectives" and rec["status"] == "failed"
    assert "wrong elements" in rec["error"] and rec["fabric"]["name"] == "loopback"
    assert rec["collectives"]["test_hooks"] == {"corrupt": [1, "all_gather"], "slow_rank": None}  # said, never hidden
    assert rec["fabric"]["transport"]["verdict"] == "ok"
    rows = rec["rows"]
    assert {r["op"] for r in rows} == set(ops.REGISTRY)
    for row in rows:
        assert row["group_size"] == 2
        _check_row_arithmetic(row)
        for place in PLACES:
            if row[place] is not None:
                assert row[place]["wrong"] == (1 if row["op"] == "all_gather" else 0), (row["op"], place)
    m = rec["metrics"]
    assert m["wrong_elements"] == 2 * 2 and m["rows_with_wrong"] == 2 * 2  # 2 sizes x 2 placements
    cells = [c["busbw"] for row in rows for c in (row["out_of_place"], row["in_place"]) if c]
    assert m["avg_busbw(GB/s)"] == pytest.approx(sum(cells) / len(cells))
    # the table: nccl-tests' footer per op, FAILED only for all_gather
    assert re.search(r"# Out of bounds values : 4 FAILED", r.stdout)
    assert r.stdout.count("# Out of bounds values : 0 OK") == len(ops.REGISTRY) - 1
    # point-to-point, OSU style: 64 B .. 4 KiB for each test, positive figures
    p2p = rec["p2p"]
    assert [p["size"] for p in p2p if p["test"] == "latency"] == [64, 128, 256, 512, 1024, 2048, 4096]
    assert {p["test"] for p in p2p} == {"latency", "bw", "bibw"} and all(p["value"] > 0 for p in p2p)
    assert m["p2p_min_latency(us)"] > 0 and "Avg Latency(us)" in r.stdout and "Bandwidth (MB/s)" in r.stdout


@pytest.mark.slow
def test_world3_every_op_is_correct_under_torchrun(out_root):
    # from 8 B: sizes 8, 128, 2048; at n=3 float, 8 B is count 0 for all_gather, reduce_scatter
    # and alltoall (2 floats // 3 ranks), which nccl-tests reports at busbw 0 and averages
    r = run_entry("collectives.py", f"output_root={out_root}", *SMALL, "collectives.minbytes=8", torchrun=3,
                  timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (rec,) = records_in(out_root)
    assert rec["status"] == "ok" and rec["world"]["world_size"] == 3
    assert rec["metrics"]["wrong_elements"] == 0 and rec["metrics"]["avg_busbw(GB/s)"] > 0
    rows = rec["rows"]
    assert {r["op"] for r in rows} == set(ops.REGISTRY)
    ag = [r for r in rows if r["op"] == "all_gather"]
    # 128 B at n=3: 32 floats -> 10 per rank -> 8 (16-B multiple) -> 96 B, said in the header
    assert ag[1]["size"] == 96 and ag[1]["requested"] == 128
    assert "sizes rounded down as nccl-tests does for all_gather at n=3: 8->0, 128->96, 2048->2016" in r.stdout
    zero = [(r["op"], r["requested"]) for r in rows if r["count"] == 0]
    assert sorted(zero) == sorted([("all_gather", 8), ("alltoall", 8), ("reduce_scatter", 8),
                                   *((f"alltoallv_{k}", 8) for k in ops.ALLTOALLV_SKEWS)])
    assert len(rows) == 3 * len(ops.REGISTRY)  # no size skipped
    m = rec["metrics"]
    for name in ops.REGISTRY:
        cells = [c["busbw"] for row in rows if row["op"] == name for c in (row["out_of_place"], row["in_place"]) if c]
        assert m[f"{name}/avg_busbw(GB/s)"] == pytest.approx(sum(cells) / len(cells))
        # each op's footer prints that same average (nccl-tests' %g)
        assert f"# Avg bus bandwidth    : {m[f'{name}/avg_busbw(GB/s)']:g} " in r.stdout
    every = [c["busbw"] for row in rows for c in (row["out_of_place"], row["in_place"]) if c]
    assert m["avg_busbw(GB/s)"] == pytest.approx(sum(every) / len(every))
    assert f"over every row of all {len(ops.REGISTRY)} ops" in r.stdout
    for row in rows:
        assert row["group_size"] == 3
        _check_row_arithmetic(row)
        for place in PLACES:
            if row[place] is not None:
                assert row[place]["wrong"] == 0, (row["op"], place)


@pytest.mark.slow
def test_collectives_record_carries_its_class_ceiling(tmp_path):
    """Issue 27 item 2 in a real run: the record says which ceiling applies and why (here,
    two Gloo ranks on one host: none), and the table prints it."""
    from helpers import records_in, run_entry

    r = run_entry("collectives.py", f"output_root={tmp_path}", "launcher.nproc_per_node=2", "collectives.minbytes=1K",
                  "collectives.maxbytes=4K", "collectives.iters=2", "collectives.warmup_iters=1",
                  "collectives.sample_iters=0", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = records_in(tmp_path)
    assert rec["ceiling"] == {"line(GB/s)": None, "band(GB/s)": [None, None],
                              "source": "Gloo on one host: memory copies, no link class"}
    assert "peak_busbw(%ceiling)" not in rec["metrics"]
    assert "# Class ceiling        : n/a (Gloo on one host" in r.stdout


def test_collectives_read_their_transport_only_after_real_collectives(tmp_path, monkeypatch):
    """collectives/run.py's _measure on a real one-rank Gloo group: when it reads the
    transport, all_reduces of a tiny and a multi-MB buffer have already run on the measured
    communicator (NCCL >= 2.22 connects channels at first use; before that its log holds no
    Channel line). The spy stands where NCCL's log would be read."""
    import torch
    import torch.distributed as dist

    from helpers.collectives import settings as _settings
    from helpers.profiles import profile
    from workloads.collectives import run
    from workloads.core.dist import DistInfo
    from workloads.fabric import verify

    sizes: list[int] = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, **kw: (sizes.append(t.numel()), real(t, **kw))[1])
    seen_at_check: list[list[int]] = []

    class Checked(Exception):
        pass

    def spy(fabric, run_dir, info):
        seen_at_check.append(list(sizes))
        raise Checked  # what comes after is the sweep, tested elsewhere

    monkeypatch.setattr(verify, "check_transport", spy)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        info = DistInfo(0, 1, 0, 1, "gloo", torch.device("cpu"))
        record = {"collectives": {}, "fabric": {}}
        with pytest.raises(Checked):
            run._measure(_settings("collectives.minbytes=1K", "collectives.maxbytes=2K", world=1), profile("loopback"),
                         info, tmp_path, record, 1, None)
    finally:
        dist.destroy_process_group()
    assert seen_at_check == [[1, 1 << 20]]


def test_record_blocks_and_table_header_are_pinned(out_root):
    """The plan that carries the collectives: section (settings.py) may be regrouped, but what a
    record and its table say may not change: analysis and every stored record read these keys,
    values and their order. Pinned from a real 2-rank Gloo run with both test hooks' shapes."""
    from workloads.collectives.settings import SLOW_RANK_ENV

    r = run_entry("collectives.py", f"output_root={out_root}", "launcher.nproc_per_node=2",
                  "collectives.ops=[all_reduce,broadcast]", "collectives.minbytes=1K", "collectives.maxbytes=4K",
                  "collectives.iters=2", "collectives.warmup_iters=1", "collectives.sample_iters=2",
                  "collectives.min_busbw=0.000001", "collectives.p2p=[latency]", "collectives.p2p_maxbytes=2",
                  "collectives.p2p_iters=2", "collectives.p2p_warmup=1", "collectives.external=off",
                  env=child_env(**{SLOW_RANK_ENV: "1:0"}), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (rec,) = records_in(out_root)
    assert list(rec["collectives"].items()) == [
        ("test_hooks", {"corrupt": None, "slow_rank": [1, 0.0]}), ("ops", ["all_reduce", "broadcast"]),
        ("pattern", "all"), ("ranks_per_node", 2), ("datatype", "float"), ("op", "sum"), ("root", 0), ("iters", 2),
        ("warmup_iters", 1), ("average", "mean"), ("check", True), ("min_busbw", 1e-06), ("groups", [[0, 1]])]
    assert list(rec) == [
        "schema", "workload", "status", "error", "created", "run_id", "overrides", "config", "fabric", "study", "world",
        "collectives", "fingerprint", "metrics", "rows", "p2p", "external", "line_rate", "nic", "ceiling", "timeline",
        "record_id"]
    config = rec["config"]
    assert list(config) == ["fabric", "model", "parallel", "workload", "collectives", "logger", "run_id",
                            "output_root", "seed", "trial", "study", "tuned", "dist", "metrics", "launcher"]
    assert {k: config[k] for k in ("workload", "logger", "run_id", "seed", "trial", "study", "tuned", "dist", "launcher")} == {
        "workload": {"name": "collectives"}, "logger": {"name": "none"}, "run_id": None, "seed": 1234, "trial": 0,
        "study": None, "tuned": None, "dist": {"timeout_s": 300}, "launcher": {"nproc_per_node": 2}}
    assert config["output_root"] == str(out_root) and rec["study"] is None
    assert rec["config"]["collectives"] == {
        "ops": ["all_reduce", "broadcast"], "minbytes": "1K", "maxbytes": "4K", "stepfactor": 2, "stepbytes": None,
        "iters": 2, "warmup_iters": 1, "datatype": "float", "op": "sum", "root": 0, "out_of_place": True,
        "in_place": True, "check": True, "average": "mean", "min_busbw": 1e-06, "pattern": "all",
        "ranks_per_node": None, "p2p": ["latency"], "p2p_ranks": None, "p2p_minbytes": 1, "p2p_maxbytes": 2,
        "p2p_iters": 2, "p2p_warmup": 1, "p2p_window": 64, "external": "off", "external_binary": "all_reduce_perf",
        "external_prefix": [], "external_timeout_s": 1800, "sample_iters": 2, "sample_maxbytes": None}
    assert [(row["op"], row["size"], row["requested"], row["count"], row["type"], row["redop"], row["root"],
             row["group_size"]) for row in rec["rows"]] == [
        ("all_reduce", 1024, 1024, 256, "float", "sum", -1, 2), ("all_reduce", 2048, 2048, 512, "float", "sum", -1, 2),
        ("all_reduce", 4096, 4096, 1024, "float", "sum", -1, 2), ("broadcast", 1024, 1024, 256, "float", "none", 0, 2),
        ("broadcast", 2048, 2048, 512, "float", "none", 0, 2), ("broadcast", 4096, 4096, 1024, "float", "none", 0, 2)]
    assert [(p["test"], p["size"]) for p in rec["p2p"]] == [("latency", 1), ("latency", 2)]
    assert rec["external"] is None and rec["status"] == "ok"
    for op in ("all_reduce", "broadcast"):
        assert (f"# Collective test starting: {op} (fabricbench, gloo, 2 ranks per communicator, pattern all)\n"
                "# minBytes 1024 maxBytes 4096 warmup iters: 1 iters: 2 validation: 1 average: mean\n") in r.stdout
    assert r.stdout.count("and 2 calls per size timed one by one after the block") == 2
    assert "ranks 0 <-> 1, 2 iters, 1 warm-up" in r.stdout
    assert re.findall(r"# Avg bus bandwidth    : \S+ (OK|FAILED)$", r.stdout, re.M) == ["OK", "OK"]
