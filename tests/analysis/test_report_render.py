"""Pure rendering and format tests (synthetic records; no launches): one list of sections
rendered twice, the headline's wording, fixed arm styles, results.csv, and the nccl-tests /
rccl-tests formats (fixtures written from the tools' source: tests/fixtures/nccl_tests/)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from analysis import external, plots, report, summary
from analysis.compare import compare_table
from analysis.load import Table, load_table, run_from_record
from helpers import FIXTURES
from helpers.records import coll, sweep, train_record
from workloads.collectives.nccltests import parse_json
from workloads.core.errors import UsageError
from workloads.core.records import write_record

FIX = FIXTURES / "nccl_tests"


def _study(tmp_path: Path):
    sweep(tmp_path / "results")
    table = load_table([tmp_path / "results"])
    return table, compare_table(table, baseline="emu-veth")


def test_markdown_and_html_come_from_the_same_sections(tmp_path):
    table, res = _study(tmp_path)
    secs = report.sections(table, res, [])
    md, page = report.to_markdown("t", secs, tmp_path), report.to_html("t", secs)
    titles = [s.title for s in secs]
    assert titles[:3] == ["Headline", "Verdicts", "Charts"] and titles[-1] == "Refused comparisons"
    for t in titles:  # the same sections, in the same order, in both
        assert f"## {t}" in md and f"<h2>{t}</h2>" in page
    assert [md.index(f"## {t}") for t in titles] == sorted(md.index(f"## {t}") for t in titles)
    assert [page.index(f"<h2>{t}</h2>") for t in titles] == sorted(page.index(f"<h2>{t}</h2>") for t in titles)


def test_headline_sentence_worked_values(tmp_path):
    table, res = _study(tmp_path)
    ((wl, claim, detail),) = [h for h in summary.headlines(res) if h[0] == "Pre-training"]
    # mb=4: 4 trials each, medians 130.25 vs 100.25 (geometric means 30.0% apart), the only training verdict
    assert claim.startswith("samples/s: loopback is 30.0% faster than emu-veth [95% CI ")
    assert claim.endswith("].") or "; this study could detect >= " in claim  # faster, equivalent or inconclusive
    assert "not significant" not in claim
    assert "Welch t on log values" in detail and "Holm over" in detail and "No A/A control arm" in detail


def test_headline_reports_a_loud_an_equivalent_and_a_mute_control():
    def run(arm, v, control=False, block=0):
        rec = train_record("ib", v, trial=block)
        rec["study"] = {"id": "s1", "arm": arm, "baseline": "ib", "control": control, "block": block, "design": "abba"}
        return run_from_record(rec)

    base = [100, 101, 99, 100, 102, 98, 101, 99]  # 8 blocks: fewer never say "equivalent"
    loud = Table([run("ib", v, block=i) for i, v in enumerate(base)] + [run("ib-aa", v * 1.3, True, i) for i, v in enumerate(base)]
                 + [run("roce", v * 0.8, block=i) for i, v in enumerate(base)])
    ((_, claim, detail),) = summary.headlines(compare_table(loud, baseline="ib"))
    assert claim.startswith("samples/s: ib is 25.0% faster than roce") and "A/A control NOT quiet" in detail
    assert "1 of 1 primary tests differ" in detail
    quiet = Table([run("ib", v, block=i) for i, v in enumerate(base)] + [run("ib-aa", v * (1 + (-1) ** i * 0.001), True, i)
                                                                        for i, v in enumerate(base)]
                  + [run("roce", v * 0.8, block=i) for i, v in enumerate(base)])
    ((_, _, detail),) = summary.headlines(compare_table(quiet, baseline="ib"))
    assert "A/A control: within +-0.1% on every primary metric (1 test; equivalent at +-2.0%)" in detail, detail
    # 3 blocks whose A/A ratios scatter by ~10%: it could only see a bias far larger than the 10% a
    # study asks for, so it says it cannot speak, never "quiet"
    mute = Table([run("ib", v, block=i) for i, v in enumerate(base[:3])] +
                 [run("ib-aa", v * f, True, i) for i, (v, f) in enumerate(zip(base[:3], (1.1, 0.92, 1.03)))] +
                 [run("roce", v * 0.8, block=i) for i, v in enumerate(base[:3])])
    ((_, _, detail),) = summary.headlines(compare_table(mute, baseline="ib"))
    assert "A/A control cannot speak: it could only detect a bias >= " in detail and "quiet" not in detail, detail


def test_arm_styles_are_fixed_and_distinct_in_greyscale():
    s = plots.arm_styles(["roce", "ib", "eth"], baseline="ib")
    assert list(s) == ["ib", "eth", "roce"]  # the baseline first, then by name: the same in every chart
    assert s == plots.arm_styles(["eth", "roce", "ib"], baseline="ib")
    assert len({v["marker"] for v in s.values()}) == 3 and len({str(v["linestyle"]) for v in s.values()}) == 3


def test_ratio_ticks_speak_percent_like_the_verdicts():
    assert plots._pct(1.299) == "+30%" and plots._pct(0.75) == "-33%" and plots._pct(1.0) == "equal"


def test_results_csv_one_row_per_record(tmp_path):
    table, _ = _study(tmp_path)
    rows = list(csv.DictReader(io.StringIO((report.write_report(table, compare_table(table, baseline="emu-veth"),
                                                                tmp_path / "rep").csv).read_text())))
    assert len(rows) == len(table)
    r = next(r for r in rows if r["record"] == "emu-mb4-t0/records/pretrain-000.json")
    assert r["arm"] == "emu-veth" and float(r["samples_per_sec"]) == 100.0 and float(r["micro_batch"]) == 4.0


def test_nccl_tests_json_fixture_is_read_with_the_runs_parser():
    rec = external.read(FIX / "all_reduce_perf-J.json")
    run = run_from_record(rec)
    assert run.fabric == "nccl-tests: all_reduce_perf-J.json" and run.workload == "collectives"
    assert [r["size"] for r in run.rows] == [1024 * 4 ** i for i in range(6)]
    first = run.rows[0]
    assert first["op"] == "all_reduce" and first["root"] == -1 and first["out_of_place"]["busbw"] == 0.05
    assert first["in_place"]["busbw"] == pytest.approx(0.0515)


def test_rccl_tests_json_lines_are_read_key_by_key():
    run = run_from_record(external.read(FIX / "all_reduce_perf-Z.jsonl"))
    assert run.fabric.startswith("rccl-tests") and len(run.rows) == 6
    assert run.rows[-1]["size"] == 1 << 20 and run.rows[-1]["in_place"]["busbw"] == pytest.approx(3.1 * 0.9)


def test_external_bad_file_is_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(UsageError, match="neither an nccl-tests -J report"):
        external.read(bad)
    with pytest.raises(UsageError, match="cannot read"):
        external.read(tmp_path / "missing.json")


def test_collectives_export_round_trips_through_the_nccl_tests_reader():
    rec = coll("ib", 0)
    for row in rec["rows"]:  # what a real record's row also holds (workloads/collectives/run.py)
        row.update(count=row["size"] // 4, redop="sum", root=-1)
        for place in ("out_of_place", "in_place"):
            row[place].update(time_us=12.5, algbw=row[place]["busbw"], wrong=0)
    docs = external.nccl_tests_json(rec)
    assert sorted(docs) == ["all_reduce", "alltoall"]
    doc = json.loads(json.dumps(docs["all_reduce"]))
    assert doc["version"] == 1 and doc["results"][0]["root"] == "    -1"
    back = parse_json(doc, "all_reduce")["rows"]
    assert [r["size"] for r in back] == [1024, 1 << 20]
    assert back[1]["out_of_place"]["busbw"] == 40.0 and back[1]["in_place"]["busbw"] == pytest.approx(40.8)


def test_busbw_chart_draws_the_external_curve_beside_ours(tmp_path):
    t = Table(run_from_record(coll(f, i, busbw=40.0 if f == "ib" else 30.0)) for f in ("ib", "roce") for i in range(2))
    charts = plots.make_all(t, tmp_path, compare_table(t, baseline="ib"), external=external.load([FIX / "all_reduce_perf-J.json"]))
    (ar,) = [p for p, _ in charts if p.stem.startswith("busbw_all_reduce")]
    svg = ar.with_suffix(".svg").read_text()
    assert "nccl-tests: all_reduce_perf-J.json (external, not compared)" in svg and "roce vs ib" in svg
    (a2a,) = [p for p, _ in charts if p.stem.startswith("busbw_alltoall")]
    assert "nccl-tests" not in a2a.with_suffix(".svg").read_text()  # another op: not drawn there


def test_report_writes_nccl_tests_documents(tmp_path):
    for i, f in enumerate(("ib", "roce")):
        write_record(tmp_path / "res" / f"c-{f}" / "records", {"schema": "fabricbench.record/1", **coll(f, i)}, "collectives")
    table = load_table([tmp_path / "res"])
    report.write_report(table, compare_table(table, baseline="ib"), tmp_path / "rep")
    docs = sorted(p.name for p in (tmp_path / "rep" / "nccl-tests").glob("*.json"))
    assert docs == ["c-ib-collectives-000-all_reduce.json", "c-ib-collectives-000-alltoall.json",
                    "c-roce-collectives-000-all_reduce.json", "c-roce-collectives-000-alltoall.json"]


def test_scaling_chart_per_group_only_where_two_gpu_counts(tmp_path):
    recs = [train_record(f, sps * w / 2, world=w, trial=t) for f, sps in (("ib", 100.0), ("roce", 90.0))
            for w in (2, 4) for t in range(2)]
    t = Table(run_from_record(r) for r in recs)
    (chart,) = [c for c in plots.make_all(t, tmp_path, compare_table(t, baseline="ib")) if c[0].stem.startswith("scaling")]
    svg = chart[0].with_suffix(".svg").read_text()
    assert "weak scaling efficiency" in chart[1] and "roce" in svg
    one = Table(run_from_record(r) for r in recs if r["world"]["world_size"] == 2)
    assert not [c for c in plots.make_all(one, tmp_path / "one") if c[0].stem.startswith("scaling")]


def test_only_refused_pairs_still_make_a_report_that_says_so(tmp_path):
    res_dir = tmp_path / "results"
    write_record(res_dir / "a" / "records", train_record("ib", 100.0, mb=4), "pretrain")
    write_record(res_dir / "b" / "records", train_record("roce", 90.0, mb=4, config__train__seq_length=256), "pretrain")
    table = load_table([res_dir])
    md = report.write_report(table, compare_table(table, baseline="ib"), tmp_path / "rep").markdown.read_text()
    head = md[md.index("## Headline"):md.index("## Verdicts")]
    assert "No two arms share a comparable point" in head
    assert "1 pair differs in config.train.seq_length" in md[md.index("## Refused comparisons"):]


def test_cli_bad_external_file_is_one_line_exit_2(tmp_path, capsys):
    from workloads.commands.cli import main

    sweep(tmp_path / "results")
    rc = main(["report", str(tmp_path / "results"), "--baseline", "emu-veth", "--out", str(tmp_path / "rep"),
               "--external", str(tmp_path / "nope.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: --external ") and "cannot read" in err[0]


def test_the_verdicts_time_worked_values():
    """Two runs of two arms, each with a launch clock: a sweep of two points in one run costs its
    latest record's mark once, and measures both windows; a record without a clock adds nothing."""
    from analysis.clock import clock

    def rec(run, window, end, at, status="ok"):
        return {"run_id": run, "status": status, "timeline": {"window": window, "window_end": end, "record": at}}

    got = clock([rec("a", 8.0, 10.0, 11.0), rec("a", 12.0, 13.5, 14.0),   # one run, two points: 14 s, 3.5 measured
                 rec("b", 5.0, 6.0, 7.0), rec("c", 1.0, 9.0, 9.5, "failed"), {"run_id": "d", "status": "ok"}],
                decided=2, primaries=3)
    assert (got.runs, got.measured_s, got.cost_s) == (2, 4.5, 21.0)
    assert got.line() == ("2 run(s): 4 s measured of 21 s from launch to record (duty cycle 21%); "
                          "2 of 3 primary verdict(s) decided, 10 s of run time each")
    assert clock([{"run_id": "d", "status": "ok"}]) is None


def test_a_report_says_how_long_its_verdicts_took(tmp_path):
    """Records that carry a launch clock get a "Time to the verdict" section; records without one
    (the synthetic study above) get none."""
    table, res = _study(tmp_path)
    assert "Time to the verdict" not in [s.title for s in report.sections(table, res, [])]
    for i, r in enumerate(table):
        r.record["timeline"] = {"window": 9.0, "window_end": 10.0, "record": 12.0}
        r.record["run_id"] = f"run-{i}"
    (sec,) = [s for s in report.sections(table, res, []) if s.title == "Time to the verdict"]
    decided = sum(c.significant or c.equivalent for _, c in res.comparisons if c.primary and not c.control)
    n = len(table)
    assert sec.blocks[-1] == ("list", [f"{n} run(s): {n} s measured of {12 * n} s from launch to record (duty cycle 8%); "
                                       f"{decided} of {sum(c.primary for _, c in res.comparisons)} primary verdict(s) decided, "
                                       f"{12 * n / decided:.0f} s of run time each"])
