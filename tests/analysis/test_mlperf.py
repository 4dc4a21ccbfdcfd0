"""MLPerf result folders in, MLPerf's scores and the project's verdicts out (analysis/mlperf.py).

The fixtures are public MLCommons results, trimmed (tests/fixtures/mlperf/README.md says from where);
the LoadGen logs of the INVALID case are written here by the real LoadGen."""

from __future__ import annotations

import array
import math

import numpy as np
import pytest

from analysis import mlperf
from helpers import REPO
from workloads.commands import cli
from workloads.core.errors import UsageError

FIX = REPO / "tests" / "fixtures" / "mlperf"
TRAIN = FIX / "training_v4.0"
INFER = FIX / "inference_v4.1" / "closed"
HPE1 = TRAIN / "HPE/results/HPE-Cray-XD670-Gen11-H100-SXM5-80GB_n1_pytorch_23.09"
HPE2 = TRAIN / "HPE/results/HPE-Cray-XD670-Gen11-H100-SXM5-80GB_n2_pytorch_23.09"


def test_olympic_mean_worked_values_and_upstream():
    # drop the fastest and the slowest, average the rest
    assert mlperf.olympic_mean([5, 1, 3, 2, 4], 0) == 3
    # one non-converged run is the dropped slowest: 1 and the failure dropped, mean(2, 3, 4)
    assert mlperf.olympic_mean([1, 2, 3, 4], 1) == 3
    assert mlperf.olympic_mean([1, 2, 3, 4], 2) is None  # more failures than may be dropped: no result
    # unet3d drops 4 each side: 40 runs 1..40 -> mean of 5..36
    assert mlperf.olympic_mean(range(1, 41), 0, mlperf.dropped_per_side("unet3d")) == pytest.approx(20.5)
    from mlperf_logging.result_summarizer.result_summarizer import _compute_olympic_average

    times = [r.seconds for r in (mlperf.training_run(p) for p in sorted(HPE1.glob("bert/result_*.txt")))]
    assert mlperf.olympic_mean(times, 0) == pytest.approx(_compute_olympic_average(list(times), 0, 1))


def test_training_folders_scored_and_judged():
    a, b = mlperf.collect(HPE2), mlperf.collect(HPE1)
    (ea,), (eb,) = a, b
    assert (ea.benchmark, ea.metric, len(ea.trials), ea.notes) == ("bert", "time_to_train(s)", 10, ())
    # run_stop - run_start of result_1.txt of n1: 1714166206446 - 1714165874995 ms (from the fixture)
    first = mlperf.training_run(HPE1 / "bert" / "result_1.txt")
    assert first.converged and first.seconds == pytest.approx(331.451)
    assert ea.system.endswith("_n2_pytorch_23.09")  # the folder names it: the logs hold a placeholder
    res = mlperf.judge(a, b, "n2", "n1")
    (row,) = res.rows
    assert row.ratio == pytest.approx(ea.score / eb.score) and 0.55 < row.ratio < 0.65
    assert row.comparison.significant and "n2's time_to_train(s) is" in mlperf.lines(res)[2]
    # two 8xH100 systems of one round, near each other: no difference called
    close = mlperf.judge(mlperf.collect(TRAIN / "Dell"), mlperf.collect(TRAIN / "GigaComputing"), "Dell", "Giga")
    assert not close.rows[0].comparison.significant
    assert "inconclusive" in mlperf.lines(close)[2]


def test_inference_folders_take_the_scenario_metric():
    a, b = mlperf.collect(INFER / "Dell"), mlperf.collect(INFER / "HPE")
    assert [(e.benchmark, e.scenario, e.metric) for e in a] == [
        ("llama2-70b-99.9", "Offline", "tokens_per_sec"), ("llama2-70b-99.9", "Server", "tokens_per_sec")]
    # Server: result_completed_tokens_per_second of the detail logs (Dell 21589.2, HPE 23144; the summary rounds otherwise)
    res = mlperf.judge(a, b, "Dell", "HPE")
    server = res.rows[1]
    assert server.a.score == pytest.approx(21589.2) and server.ratio == pytest.approx(21589.2 / 23144)
    # one run a side is a ratio, never a verdict
    assert not server.comparison.tested and "not tested (1 vs 1 runs" in mlperf.lines(res)[4]


def _loadgen_invalid(out):
    """A real LoadGen Offline run too short for its min duration: INVALID, 'Min duration' not met."""
    import mlperf_loadgen as lg

    payload = array.array("B", np.array([7, 7], np.int32).tobytes())

    def issue(queries):
        addr, n = payload.buffer_info()
        lg.QuerySamplesComplete([lg.QuerySampleResponse(q.id, addr, n * payload.itemsize) for q in queries])

    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(8, 8, lambda s: None, lambda s: None)
    ts = lg.TestSettings()
    ts.scenario, ts.mode = lg.TestScenario.Offline, lg.TestMode.PerformanceOnly
    ts.min_duration_ms, ts.min_query_count, ts.offline_expected_qps = 60_000, 1, 10
    log = lg.LogOutputSettings()
    log.outdir, log.copy_summary_to_stdout = str(out), False
    settings = lg.LogSettings()
    settings.log_output = log
    lg.StartTestWithLogSettings(sut, qsl, ts, settings)
    lg.DestroyQSL(qsl)
    lg.DestroySUT(sut)


def test_an_invalid_loadgen_run_is_no_trial(tmp_path):
    run = tmp_path / "sysA" / "Offline"
    run.mkdir(parents=True)
    _loadgen_invalid(run)
    (entry,) = mlperf.collect(tmp_path / "sysA")
    assert entry.scenario == "Offline" and entry.trials == () and entry.score is None
    assert entry.notes == ("Offline: INVALID (min duration not met)",)
    res = mlperf.judge([entry], mlperf.collect(INFER / "HPE")[:1], "A", "HPE")
    assert res.rows == [] or res.rows[0].comparison is None  # a different benchmark: nothing shared


def test_bad_folders_are_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("result: fast\n")
    (tmp_path / "result_1.txt").write_text("no mllog lines here\n")
    assert cli.main(["mlperf", str(tmp_path), str(HPE1)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an MLPerf result folder" in err[0]
    assert cli.main(["mlperf", str(tmp_path / "absent"), str(HPE1)]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert cli.main(["mlperf", str(HPE1)]) == 2
    with pytest.raises(UsageError, match="two systems"):
        mlperf.judge(mlperf.collect(TRAIN / "HPE"), mlperf.collect(HPE1), "both", "n1")


def _entry(values, system):
    return mlperf.Entry("training", "bert", "", mlperf.TRAINING_METRIC, mlperf.olympic_mean(values, 0),
                        tuple(values), system, ())


@pytest.mark.parametrize("shift, seed, calls", [(1.0, 5901, "aa"), (1.08, 5902, "ab")])
def test_verdicts_simulated(shift, seed, calls):
    """Ten runs a side, log-normal with the fixtures' spread (~6%): an A/A pair calls a difference at
    about alpha; an 8% slower system is called slower at least 80% of the time."""
    rng = np.random.default_rng(seed)
    n, called, right = 120, 0, 0
    for _ in range(n):
        a = list(320 * shift * np.exp(rng.normal(0, 0.03, 10)))
        b = list(320 * np.exp(rng.normal(0, 0.03, 10)))
        c = mlperf.judge([_entry(a, "A")], [_entry(b, "B")], "A", "B").rows[0].comparison
        called += c.significant
        right += c.significant and c.ratio > 1
    if calls == "aa":
        assert called / n <= 0.10
    else:
        assert right / n >= 0.80
        assert not math.isnan(c.p)
