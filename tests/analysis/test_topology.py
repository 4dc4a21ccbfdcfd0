"""The fabric's shape in the report (analysis/topology.py): a diagram per emulated topology, the
spines' byte shares per arm, and the concurrent-jobs table, from records and the emulator's
jobs summaries written here (the real emulator writes them in tests/fabric/test_leafspine.py)."""

from __future__ import annotations

import json

import pytest

from analysis import topology
from analysis.compare import compare_table
from analysis.load import load_table
from analysis.report import write_report
from helpers.records import coll
from workloads.core.records import SCHEMA, write_record

LEAF_SPINE = {"nodes": 4, "topology": "leaf-spine", "leaves": 2, "spines": 2, "rate": "100mbit",
              "uplink_rate": "100mbit", "hash": "l4"}


def _rec(fabric: str, trial: int, share: dict | None, block: dict) -> dict:
    r = {"schema": SCHEMA, **coll(fabric, trial, world=4)}
    r["config"]["fabric"]["emulate"] = block
    if share is not None:
        r["paths"] = {"per_path_bytes": {k: int(v * 1000) for k, v in share.items()}, "share": share,
                      "jain_index": None}
    return r


def _folder(tmp_path):
    for t, (a, b) in enumerate([(0.75, 0.25), (0.5, 0.5), (0.25, 0.75)]):
        write_record(tmp_path / "r" / "l4" / "records", _rec("emu-l4", t, {"s0": a, "s1": b}, LEAF_SPINE), "c")
        write_record(tmp_path / "r" / "l3" / "records", _rec("emu-l3", t, {"s0": 1.0, "s1": 0.0},
                                                            LEAF_SPINE | {"hash": "l3"}), "c")
    (tmp_path / "r" / "jobs-7.json").write_text(json.dumps({
        "jobs": [{"job": 0, "nodes": [0, 2], "status": "ok", "exit_code": 0, "jct_s": 12.25,
                  "metric": "all_reduce/avg_busbw(GB/s)", "value": 0.006},
                 {"job": 1, "nodes": [1, 3], "status": "ok", "exit_code": 0, "jct_s": 12.5,
                  "metric": "all_reduce/avg_busbw(GB/s)", "value": 0.0066}],
        "jain_index": 0.998, "metric": "all_reduce/avg_busbw(GB/s)"}))
    return tmp_path / "r"


def test_shares_are_medians_per_arm_normalised_and_never_mix_spine_counts(tmp_path):
    table = load_table([str(_folder(tmp_path))])
    got = topology.shares_by_arm(table)
    assert got["emu-l4"] == {"s0": 0.5, "s1": 0.5}           # medians of 0.75/0.5/0.25 and 0.25/0.5/0.75
    assert got["emu-l3"] == {"s0": 1.0, "s1": 0.0}
    one = {"schema": SCHEMA, **coll("emu-l4", 9, world=4)}
    one["paths"] = {"share": {"s0": 1.0}}
    write_record(tmp_path / "r" / "one" / "records", one, "c")
    got = topology.shares_by_arm(load_table([str(tmp_path / "r")]))
    assert got["emu-l4 (2 spines)"] == {"s0": 0.5, "s1": 0.5} and got["emu-l4 (1 spine)"] == {"s0": 1.0}


def test_describe_says_the_topology():
    assert topology.describe(LEAF_SPINE) == ("leaf-spine: 4 hosts on 2 leaves, 2 spines; host links 100mbit, "
                                             "uplinks 100mbit, ECMP l4")
    assert topology.describe({"nodes": 2, "rate": "100mbit"}) == "2 nodes on a veth pair, links 100mbit"
    assert topology.describe({"nodes": 3, "rate": None}) == "3 nodes on one bridge (star), links unshaped"


def test_report_draws_each_topology_and_the_shares_and_lists_the_jobs(tmp_path):
    root = _folder(tmp_path)
    table = load_table([str(root)])
    rep = write_report(table, compare_table(table, baseline="emu-l3"), tmp_path / "out")
    names = sorted(p.name for p in rep.images)
    assert "path-shares.png" in names and names.count("topology-0.png") == 1 and "topology-1.png" in names
    assert "jobs.png" in names  # the JCT and fairness chart beside the table
    md = rep.markdown.read_text()
    assert "Emulated fabric: leaf-spine: 4 hosts on 2 leaves, 2 spines; host links 100mbit, uplinks 100mbit, ECMP l3" in md
    assert "## Concurrent jobs" in md
    assert "| jobs-7.json | 0 | 0,2 | ok | 12.25 | all_reduce/avg_busbw(GB/s) | 0.006 | 0.998 |" in md
    assert "data:image/png;base64" in rep.html.read_text()


@pytest.mark.parametrize("block", [LEAF_SPINE, {"nodes": 2, "rate": "1gbit"}, {"nodes": 4, "rate": None}])
def test_diagram_is_a_picture(tmp_path, block):
    png, caption = topology.diagram(block, tmp_path, "t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "t.svg").is_file()
    assert caption.startswith("Emulated fabric: ")


def test_busbw_is_stated_against_the_raw_link_the_same_arm_measured(tmp_path):
    """Worked: iperf3 received 0.1 and 0.12 Gbit/s (median 0.11); peak busbw 0.011 GB/s = 0.088 Gbit/s:
    80.0% of the raw link. An arm without a link run gets no row."""
    for t, gbit in enumerate((0.1, 0.12)):
        write_record(tmp_path / "r" / "link" / "records", {
            "schema": SCHEMA, "workload": "link", "status": "ok", "run_id": f"l{t}", "config": {"fabric": {"name": "emu"},
                                                                                             "trial": t},
            "fabric": {"name": "emu"}, "world": {"world_size": 2, "nodes": 2},
            "metrics": {"throughput_received(Gbit/s)": gbit}}, "l")
    for arm in ("emu", "other"):
        rec = {"schema": SCHEMA, **coll(arm, 0, world=2)}
        rec["metrics"]["peak_busbw(GB/s)"] = 0.011
        write_record(tmp_path / "r" / arm / "records", rec, "c")
    rows = topology.against_raw_link(load_table([str(tmp_path / "r")]))
    assert rows == [["emu", "0.11", "2", "peak_busbw (median over records)", "0.088", "80.0%"]]


def _summary(fabric: str, makespan: float) -> dict:
    return {"fabric_name": fabric, "jct_s": {"max": makespan, "min": makespan - 0.2},
            "jobs": [{"job": 0, "exit_code": 0}, {"job": 1, "exit_code": 0}]}


def test_jct_verdicts_call_a_real_difference_and_not_an_aa_one():
    """Each run's makespan is one sample. A/B: runs on one spine take ~2x as long as on two (5 runs
    each) and it is called, with the interval; A/A: two labels of one distribution, interleaved,
    called nothing; one run each: 'not tested', said as such, not a verdict."""
    one = [20.1, 19.6, 21.0, 20.4, 19.9]
    two = [10.2, 10.6, 9.9, 10.4, 10.1]
    (ab,) = topology.jct_verdicts([_summary("one-spine", v) for v in one] + [_summary("two-spines", v) for v in two],
                                  baseline="one-spine")
    # a time: its own change, "lower" (a halved JCT is ~50% lower, never "100% faster")
    assert ab.startswith("JCT (the makespan of each run's jobs): two-spines's jct_max(s) is 4"), ab
    assert "lower than one-spine's [" in ab and "Welch t p=" in ab
    (aa,) = topology.jct_verdicts([_summary("a", v) for v in (10.2, 10.6, 9.9, 10.4, 10.1)] +
                                  [_summary("a2", v) for v in (10.3, 10.5, 10.0, 10.2, 10.45)], baseline="a")
    assert " lower than " not in aa.split("; ")[0].replace("inconclusive", "") or "inconclusive" in aa
    assert "is faster than" not in aa and aa.split(": ", 1)[1].startswith(("inconclusive", "equivalent")), aa
    (few,) = topology.jct_verdicts([_summary("x", 10.0), _summary("y", 20.0)])
    assert "not tested (1 vs 1 runs" in few
    failed = _summary("z", 5.0)
    failed["jobs"][1]["exit_code"] = 1  # a run whose job failed has no makespan to compare
    assert topology.jct_verdicts([failed, _summary("x", 10.0)]) == []


def test_compare_prints_the_jct_verdict_of_the_jobs_summaries_it_finds(tmp_path, capsys):
    """`fabricbench compare <dir>` reads the emulator's jobs-*.json under the folders it is given
    (beside the records of the same runs) and prints the JCT verdict after the metric verdicts."""
    from workloads.commands.cli import main as cli_main

    root = _folder(tmp_path)
    for k, (fabric, makespan) in enumerate([(f, v) for f, vs in (("emu-l3", (20.1, 19.6, 21.0, 20.4, 19.9)),
                                                                  ("emu-l4", (10.2, 10.6, 9.9, 10.4, 10.1)))
                                            for v in vs]):
        (root / f"jobs-{100 + k}.json").write_text(json.dumps(_summary(fabric, makespan)))
    assert cli_main(["compare", str(root), "--baseline", "emu-l3"]) == 0
    out = capsys.readouterr().out
    assert "JCT (the makespan of each run's jobs): emu-l4's jct_max(s) is " in out, out
