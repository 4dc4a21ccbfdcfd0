"""What a new user reads: which refusals are shown, the --allow hint, verdict wording, and
the report's Runs and Verdicts tables. Synthetic records written to disk the way run
directories hold them (each run directory has the same record file names)."""

from __future__ import annotations

import re

import pytest

from analysis import export, stats
from analysis.compare import compare_table
from analysis.load import load_table
from analysis.report import write_report
from helpers.records import UPGRADE, coll, sweep, train_record
from workloads.commands.cli import main as cli_main
from workloads.core.records import write_record


def test_only_near_misses_are_refused_and_the_allow_hint_pastes(tmp_path, capsys):
    sweep(tmp_path)
    res = compare_table(load_table([tmp_path]), baseline="emu-veth")
    assert [c.fabric for _, c in res.comparisons] == ["loopback"]
    # one refusal: the mb=8 pair, baseline first; mb=1, mb=2 and zero3 are counted, not paired
    (ref,) = res.refusals
    assert ref.a.startswith("emu-veth (") and ref.b.startswith("loopback (") and "emu-mb8" in ref.a and "lo-mb8" in ref.b
    assert set(ref.diffs) == {"fingerprint.torch", "fingerprint.cuda", "fingerprint.driver", "fingerprint.gpu"}
    assert sorted(p.label for p in res.unmatched) == ["pretrain neox-tiny ddp gpus=2 batch=2 mb=1",
                                                      "pretrain neox-tiny ddp gpus=2 batch=4 mb=2",
                                                      "pretrain neox-tiny zero3 gpus=2 batch=8 mb=4"]
    assert not res.splits  # points one fabric alone ran: nothing split them off a sibling

    assert cli_main(["compare", str(tmp_path), "--baseline", "emu-veth"]) == 0
    out = capsys.readouterr().out
    assert out.count("refused:") == 1 and "3 points had no counterpart in another fabric" in out and "--verbose" in out
    assert "mb=1" not in out  # counted, not listed
    # every differing key is in the hint, so pasting it gets the comparison
    (line,) = [ln for ln in out.splitlines() if ln.startswith("refused:")]
    hint = re.findall(r"--allow (\S+?)[ )]", line)
    assert sorted(hint) == sorted(ref.diffs) and not re.search(r"and \d+ more", line)
    argv = [a for k in hint for a in ("--allow", k)]
    assert cli_main(["compare", str(tmp_path), "--baseline", "emu-veth", *argv]) == 0
    out = capsys.readouterr().out
    assert "refused:" not in out and out.count("[samples_per_sec]") == 2, out

    assert cli_main(["compare", str(tmp_path), "--baseline", "emu-veth", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "pretrain neox-tiny zero3 gpus=2 batch=8 mb=4: only loopback (2 records)" in out and "mb=1" in out


def test_a_point_split_off_by_a_new_commit_is_named(tmp_path, capsys):
    """A study resumed after a `git pull`: the late run of one fabric is its own point (another
    commit is other code), so it has no counterpart. Compare names the key that split it from
    its sibling instead of only counting it, and `--allow` on that key pools it back."""
    for i, (fabric, sps) in enumerate([("a", 100.0), ("b", 80.0), ("a", 101.0), ("b", 79.0), ("a", 99.0), ("b", 81.0)]):
        write_record(tmp_path / f"{fabric}{i}" / "records", train_record(fabric, sps, trial=i), "pretrain")
    write_record(tmp_path / "b9" / "records", train_record("b", 80.5, trial=9, fingerprint__git__commit="def"), "pretrain")
    res = compare_table(load_table([tmp_path]), baseline="a")
    (orphan,) = res.unmatched
    assert list(orphan.by_fabric) == ["b"] and res.splits == {id(orphan): {"fingerprint.git.commit": ("def", "abc")}}
    assert [c.n for _, c in res.comparisons if c.metric == "samples_per_sec"] == [3]

    assert cli_main(["compare", str(tmp_path), "--baseline", "a"]) == 0
    out = capsys.readouterr().out
    assert ("1 point had no counterpart in another fabric (or no a run to compare with); 1 of them differs from a point of "
            "the same fabric and coordinates only in fingerprint.git.commit (the code changed between their runs: run a "
            "study on one commit); --allow fingerprint.git.commit pools them; --verbose lists them") in out, out
    assert cli_main(["compare", str(tmp_path), "--baseline", "a", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert ("pretrain neox-tiny ddp gpus=2 batch=8 mb=4: only b (1 record); split from its sibling by "
            "fingerprint.git.commit ('def' vs 'abc')") in out, out
    assert export.as_dict(res)["unmatched"] == [{"point": orphan.label, "fabrics": ["b"], "records": 1,
                                                 "split": {"fingerprint.git.commit": ["def", "abc"]}}]
    res = compare_table(load_table([tmp_path]), baseline="a", allow=["fingerprint.git.commit"])
    assert not res.unmatched and [c.n for _, c in res.comparisons if c.metric == "samples_per_sec"] == [4]


def test_confounded_only_pair_still_refused_with_keys(tmp_path, capsys):
    # nothing comparable at all: the near miss is the error, with its keys and a full hint
    write_record(tmp_path / "a" / "records", train_record("emu-veth", 100.0, mb=8), "pretrain")
    write_record(tmp_path / "b" / "records", train_record("loopback", 120.0, mb=8, **UPGRADE), "pretrain")
    assert cli_main(["compare", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "fingerprint.driver (None vs '570')" in err and all(f"--allow fingerprint.{k}" in err for k in ("cuda", "driver", "gpu", "torch"))


@pytest.mark.parametrize("x, y, hib, start", [
    # overlapping runs: whoever is ahead is named first, with the interval of that percentage
    ([70.0, 95.0, 90.0], [100.0, 80.0, 105.0], True, "inconclusive: emu-veth faster than loopback by 12.0% [-21.2, +59.1]"),
    # a latency, lower is better: its own change, "lower"
    ([130.0, 100.0, 115.0], [100.0, 125.0, 105.0], False, "inconclusive: emu-veth's m 4.2% lower than loopback's [-27.2, +27.9]"),
    ([110.0, 125.0, 95.0], [100.0, 95.0, 105.0], True, "inconclusive: loopback faster than emu-veth by 9.4% [-18.9, +47.6]"),
])
def test_non_significant_verdict_names_who_is_ahead(x, y, hib, start):
    c = stats.compare(x, y, "loopback", "emu-veth", "m", judging=stats.Judging(higher_is_better=hib))
    assert not c.significant and c.speedup_lo < 1 < c.speedup_hi
    assert c.verdict.startswith(start), c.verdict


def test_report_tables(tmp_path):
    sweep(tmp_path / "results")
    for i, (f, bw) in enumerate((("emu-veth", 40.0), ("loopback", 30.0))):
        rec = {"schema": "fabricbench.record/1", **coll(f, i, busbw=bw)}
        rec["config"].update(model={"name": "neox-tiny"}, parallel={"name": "ddp"})  # Hydra defaults, not measured
        write_record(tmp_path / "results" / f"coll-{f}" / "records", rec, "pretrain")
    table = load_table([tmp_path / "results"])
    res = compare_table(table, baseline="emu-veth")
    md = write_report(table, res, tmp_path / "rep").markdown.read_text()
    runs = md[md.index("## Runs"):]
    # each record named by its run directory: the bare name pretrain.json is in every one
    assert "| emu-mb8-t1/records/pretrain-000.json | emu-veth |" in runs and "| lo-zero3-t0/records/pretrain-000.json |" in runs
    assert "| coll-loopback/records/pretrain-000.json | loopback | collectives | — | — | — | 8 |" in runs
    # collectives labels carry no model or parallel either
    assert any(p.label == "collectives gpus=8" for p, _ in res.comparisons)
    # the difference column says what the verdict text says: medians 130.25 vs 100.25, geometric means 30.0% apart
    (row,) = [ln for ln in md.splitlines() if "| samples_per_sec |" in ln]
    assert "| 100.2 |" in row and "| 130.2 |" in row and "| loopback 30.0% faster [" in row
    words = md[md.index("Every verdict in words"):]
    assert "loopback is faster than emu-veth by 30.0%" in words
    # busbw 30 vs 40 GB/s (one trial each: not tested): emu-veth 33.3% faster, in the table and in words
    (row,) = [ln for ln in md.splitlines() if "| all_reduce/avg_busbw(GB/s) |" in ln]
    assert "| gpus=8 |" in row and "| emu-veth 33.3% faster (not tested) |" in row and "| not tested |" in row
    assert "[all_reduce/avg_busbw(GB/s)]: not tested (1 vs 1 runs; need >= 2 runs each" in words
    assert "emu-veth faster than loopback by 33.3% (Welch t on log values" in words
    assert "speed-up" not in md and "0.750" not in md  # one way to say a ratio
    # the refused pair: collapsed at the end, grouped by the differing keys, paths relative to the input
    refused = md[md.index("## Refused comparisons"):]
    assert md.index("## Refused comparisons") > md.index("## Runs") and refused.startswith("## Refused comparisons\n\n<details>")
    assert "1 pair differs in fingerprint.cuda, fingerprint.driver, fingerprint.gpu, fingerprint.torch" in refused
    assert str(tmp_path) not in refused and "emu-mb8-t0/records/pretrain-000.json" in refused
    assert "3 points had no counterpart" in md
    # the first screen: the headline before the verdict table, both before any chart
    assert md.index("## Headline") < md.index("## Verdicts") < md.index("## Charts")


def test_a_cpu_points_label_counts_ranks_not_gpus(tmp_path):
    """A verdict on CPU runs (fingerprint.gpu_count 0: Gloo ranks are processes) says ranks=N;
    the same runs on GPUs say gpus=N."""
    for fabric in ("a", "b"):
        for t in range(2):
            rec = train_record(fabric, 100.0 + t, trial=t)
            rec["fingerprint"].update(gpu=None, gpu_count=0)
            write_record(tmp_path, rec, f"{fabric}-{t}")
    res = compare_table(load_table([tmp_path]), baseline="a")
    assert [p.label for p, _ in res.comparisons] == ["pretrain neox-tiny ddp ranks=2 batch=8 mb=4"]
