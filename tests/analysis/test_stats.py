"""Statistics and the apples-to-apples guard on synthetic records with known ratios and noise."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis import guard, stats
from analysis.compare import compare_table
from analysis.load import Table, load_table, run_from_record
from helpers.records import synthetic, train_record
from workloads.commands.cli import main as cli_main
from workloads.core.records import write_record


def test_median_and_ratio_intervals_hand_checked():
    med, lo, hi = stats.bootstrap_median([1.0, 2.0, 3.0, 4.0, 100.0])
    assert med == 3.0 and lo >= 1.0 and hi <= 100.0 and lo <= 3.0 <= hi
    assert stats.bootstrap_median([5.0]) == (5.0, 5.0, 5.0)
    # Hodges-Lehmann: the median of the 16 differences 6..12 is 9; 4 vs 4 keeps every shift but
    # the two fully separated ones (p = 2/70 < 0.05; U = 1 gives 4/70 > 0.05): [6, 12]
    assert stats.hodges_lehmann([10, 11, 12, 13], [1, 2, 3, 4]) == (9.0, 6.0, 12.0)
    assert stats.hodges_lehmann([2.0, 2.0, 2.0], [1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)


def test_permutation_p_exact_floor():
    # 3 vs 3 completely separated: 2 of the C(6,3)=20 relabelings are as extreme -> p = 0.1
    assert stats.permutation_p([10, 11, 12], [1, 2, 3]) == pytest.approx(2 / 20)
    # 2 vs 2 can never go below 2/C(4,2) = 1/3
    assert stats.permutation_p([10, 11], [1, 2]) == pytest.approx(1 / 3)


@pytest.mark.parametrize("ratio,noise,seed", [(1.30, 0.03, 1), (0.80, 0.05, 2), (1.05, 0.01, 3)])
def test_known_ratio_recovered_within_interval(ratio, noise, seed):
    res = compare_table(Table(run_from_record(r) for r in synthetic(ratio, noise, 8, seed)), baseline="a")
    assert len(res.comparisons) == 1
    _, c = res.comparisons[0]
    assert c.lo <= ratio <= c.hi, (ratio, c)
    assert abs(c.ratio / ratio - 1) < 3 * noise
    assert c.significant and c.p < 0.05
    if ratio > 1:
        assert c.verdict.startswith(f"b is faster than a by {100 * (c.speedup - 1):.1f}% [")
    else:
        assert c.verdict.startswith("a is faster than b by ")


def test_no_difference_says_so():
    res = compare_table(Table(run_from_record(r) for r in synthetic(1.0, 0.05, 8, 7)), baseline="a")
    _, c = res.comparisons[0]
    assert not c.significant and c.lo <= 1.0 <= c.hi
    # never a bare "not significant": the interval, and what this test could have seen
    assert c.verdict.startswith("inconclusive: b faster than a by 0.3% [-3.2, +4.0]; it rules out a difference of "
                                "10.0% or more, not yet equivalent within +-2.0% (95% CI; Welch t p=0.858"), c.verdict
    wide = stats.compare([1.0, 1.3, 0.8, 1.1, 0.95, 1.2], [1.1, 0.9, 1.25, 0.85, 1.0, 1.05], "b", "a", "samples_per_sec")
    assert wide.outcome == "inconclusive" and "; this test could detect >= " in wide.verdict, wide.verdict


def test_lower_is_better_metric_is_worded_as_its_own_change():
    # a halved TTFT is "50% lower", the metric's own change, never "100% faster" (a speed ratio
    # read as a latency: TTFT cannot fall by more than 100%)
    c = stats.compare([50, 51, 52, 49, 50], [100, 101, 99, 100, 102], "b", "a", "median_ttft_ms", judging=stats.Judging(higher_is_better=False))
    assert c.ratio == pytest.approx(0.5, rel=0.01) and c.speedup == pytest.approx(2.0, rel=0.01)
    assert c.verdict.startswith("b's median_ttft_ms is 49.8% lower than a's [48.4, 51.2]"), c.verdict
    assert "faster" not in c.verdict
    # 25% higher the other way round: "lower" for the side ahead, its interval below 100%
    up = stats.compare([125, 126, 124, 125, 125], [100, 101, 99, 100, 100], "roce", "ib", "p99_ttft_ms", judging=stats.Judging(higher_is_better=False))
    assert up.verdict.startswith("ib's p99_ttft_ms is 20.0% lower than roce's ["), up.verdict
    lead, _, frac, lo, hi = stats.edge(up)
    assert lead == "ib" and 0 < lo < frac < hi < 1


def test_single_trial_is_not_tested():
    c = stats.compare([10.0], [9.0, 9.1], "b", "a", "samples_per_sec")
    assert c.verdict.startswith("not tested (1 vs 2 runs; need >= 2 runs each") and not c.significant and math.isnan(c.p)


def test_confounded_pair_refused_with_key_named():
    a, b = train_record("a", 100.0, mb=4), train_record("b", 130.0, mb=8)
    ref = guard.check(a, b)
    assert ref is not None and "batch.micro_batch_size" in ref.diffs
    assert ref.diffs["batch.micro_batch_size"] == (4, 8)
    assert not any(k.startswith(("config.fabric", "fabric", "fingerprint.hostname", "config.run_id")) for k in ref.diffs)
    res = compare_table(Table([run_from_record(a), run_from_record(b)]))
    assert res.comparisons == [] and len(res.refusals) == 1
    assert "batch.micro_batch_size (4 vs 8)" in res.refusals[0].message()
    # declared allowed: then compared
    assert guard.check(a, b, allow=["batch", "config.train.micro_batch_size"]) is None


def test_a_served_engines_own_nccl_is_identity_its_interpreter_path_is_not():
    a, b = train_record("a", 100.0), train_record("b", 100.0)
    for rec, nccl, py in ((a, "2.27.3", "/a/.engines/vllm/bin/python"), (b, "2.28.9", "/b/venv/bin/python")):
        rec["fingerprint"]["engine"] = {"python": py, "torch": "2.9.0", "nccl": nccl, "vllm": "0.32.0"}
    assert set(guard.differences(a, b)) == {"fingerprint.engine.nccl"}


def test_software_and_hardware_differences_refused():
    a = train_record("a", 100.0)
    b = train_record("b", 100.0, fingerprint__torch="2.6.0", fingerprint__gpu="NVIDIA A100")
    assert set(guard.differences(a, b)) == {"fingerprint.torch", "fingerprint.gpu"}
    assert guard.check(a, b, allow=["fingerprint.*"]) is None


def test_cli_compare_on_disk(tmp_path: Path, capsys):
    for r in synthetic(1.3, 0.02, 5, 11):
        write_record(tmp_path / r["fabric"]["name"], r, "rec")
    table = load_table([tmp_path])
    assert len(table) == 10 and table.fabrics == ["a", "b"]
    assert len(load_table([tmp_path, tmp_path / "a"])) == 10  # overlapping directories: each record once
    # typed columns; a redacted tokens_per_sec is recomputed as sps x seq_length
    assert table.column("samples_per_sec").dtype == float
    assert table[0].metrics["tokens_per_sec"] == pytest.approx(table[0].metrics["samples_per_sec"] * 128)
    assert cli_main(["compare", str(tmp_path), "--baseline", "a"]) == 0
    out = capsys.readouterr().out
    assert "b is faster than a by" in out and "%" in out and "[" in out
    # confounded set: exit 2 and the key named
    conf = tmp_path / "conf"
    write_record(conf, train_record("a", 100.0, mb=4), "x")
    write_record(conf, train_record("b", 100.0, mb=8), "x")
    assert cli_main(["compare", str(conf)]) == 2
    assert "batch.micro_batch_size" in capsys.readouterr().err
    assert cli_main(["compare", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_transport_mismatch_flagged(tmp_path: Path):
    from analysis.report import write_report

    recs = synthetic(1.0, 0.02, 2, 5)
    recs[0]["fabric"]["transport"] = {"verdict": "mismatch", "message": "fabric=a but traffic went over NET/Socket"}
    recs[-1]["fabric"]["transport"] = {"verdict": "ok", "summary": {"network": "Socket"}}
    table = Table(run_from_record(r) for r in recs)
    rep = write_report(table, compare_table(table), tmp_path / "rep")
    md = rep.markdown.read_text()
    assert "transport mismatch" in md and "NET/Socket" in md and "ok (Socket)" in md
    assert "transport mismatch" in rep.html.read_text()
    json.loads(json.dumps([c.verdict for _, c in compare_table(table).comparisons]))
