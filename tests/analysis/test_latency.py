"""The latency arithmetic beside a delay study's verdicts, and the sensitivity slopes
(analysis/latency.py, `fabricbench sensitivity`), pinned with worked values."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from analysis.latency import Cell, arithmetic, one_way_ms, slopes, unit_ms
from helpers import REPO, child_env


def _delay(p50_us: float) -> dict:
    d = {"frames": 500, "p50_us": p50_us}
    return {"links": {"n0-n1": {"asked_us": p50_us, "directions": {"n0->n1": d, "n1->n0": d}}}}


def _rec(kind: str, p50_us: float, value: float, rate: str = "1gbit", **cfg) -> dict:
    rec = {"status": "ok", "workload": kind, "point": None,
           "config": {"fabric": {"name": "emu-1g", "emulate": {"rate": rate, "latency": f"{p50_us:g}us"}},
                      "model": {"num_layers": 2}, **cfg},
           "fabric": {"delay": _delay(p50_us)}}
    if kind == "collectives":
        rec["rows"] = [{"op": "all_reduce", "size": 4 << 20, "stability": {"p50(us)": 99_000.0}},
                       {"op": "all_reduce", "size": 1024, "stability": {"p50(us)": value * 1e3}}]
    elif kind == "inference":
        rec["metrics"] = {"median_tpot_ms": value, "median_ttft_ms": value + 5}
        rec["server"] = {"tp": 2}
    else:
        rec["metrics"] = {"iteration_time(s)": value / 1e3}
    return rec


def test_units_and_the_achieved_delay():
    ar = _rec("collectives", 2500.0, 9.0)
    assert unit_ms(ar) == {"all_reduce": 9.0, "size": 1024}       # the smallest size prices one call
    assert one_way_ms(ar) == 2.5
    assert unit_ms(_rec("inference", 500.0, 24.0)) == {"tpot": 24.0, "ttft": 29.0}
    assert unit_ms(_rec("pretrain", 500.0, 47.0)) == {"step": 47.0}
    asked_only = {"config": {"fabric": {"emulate": {"latency": "2ms"}}}}
    assert one_way_ms(asked_only) == 2.0 and one_way_ms({"config": {}}) is None


def _in_block(rec: dict, block: int) -> dict:
    rec["study"] = {"block": block}
    return rec


def test_arithmetic_worked_values():
    """+2 ms one way; one 1 KiB all_reduce +8 ms in every block = 2 round trips; a TP=2 token of a
    2-layer model waits for 4 all_reduces and the step plan's broadcast, so +40 ms is predicted,
    and +40 measured reads 1.00; a 47 ms step that gains 33 ms gained 4.1 small all_reduces' worth.
    The added times are paired within blocks: a step that gains 30, 33 and 36 ms in its three
    blocks has mean 33 and sd 3, so its 95% t interval is 33 +- 4.303 x 3 / sqrt(3) = [25.55, 40.45]."""
    cells = []
    for arm, d, ar, tpot, step1, step8 in (("near", 500.0, 1.0, 24.0, 47.0, 125.0), ("far", 2500.0, 9.0, 64.0, 80.0, 158.0)):
        for trial in range(3):
            wobble = 3.0 * (trial - 1) if arm == "far" else 0.0
            cells += [Cell("allreduce-1k", "-", arm, _in_block(_rec("collectives", d, ar), trial)),
                      Cell("tp2", "c1", arm, _in_block(_rec("inference", d, tpot), trial)),
                      Cell("train", "p0", arm, _in_block(_rec("pretrain", d, step1), trial)),
                      Cell("train", "p1", arm, _in_block(_rec("pretrain", d, step8 + wobble), trial))]
    lines = arithmetic(cells, "near")
    assert lines[0] == ("latency arithmetic, far vs near: +2.000 ms one way (achieved, median of the records' "
                        "delay-line p50s); added times are the mean of the per-block differences (paired, as the "
                        "verdicts) with their 95% t interval")
    assert lines[1] == ("  one all_reduce of 1024 B (allreduce-1k, the timed block's time per call): +8.000 ms [+8.000, "
                        "+8.000] = 2.00 [2.00, 2.00] round trips of the added delay")
    assert ("  tp2 c1: TPOT +40.00 ms [+40.00, +40.00], TTFT +40.00 ms [+40.00, +40.00] measured; arithmetic: 5 "
            "collectives per token (2 x 2 layers' all_reduces + the step plan's broadcast, TP=2) x +8.000 ms = +40.00 ms "
            "[+40.00, +40.00] (measured/arithmetic 1.00)") in lines
    assert ("  train p0: step +33.00 ms [+33.00, +33.00] measured (+70.2% of 47.0 ms) = 4.1 small all_reduces' worth "
            "of waiting per step") in lines
    assert "  train p1: step +33.00 ms [+25.55, +40.45] measured (+26.4% of 125.0 ms)" in " ".join(lines)
    # a point whose verdict called nothing claims no count: its difference and interval only
    quiet = arithmetic(cells, "near", lambda w, p, arm: "inconclusive" if p == "p1" else None)
    assert ("  train p1: step +33.00 ms [+25.55, +40.45] measured (+26.4% of 125.0 ms); not called (inconclusive), so "
            "no count of waiting is claimed") in quiet
    # a step that came out faster (noise, at micro-batch 16 in a 3-block run) is signed once: "-0.93", not "+-0.93"
    hidden = [Cell(c.workload, c.point, c.arm, _in_block(_rec("pretrain", 2500.0 if c.arm == "far" else 500.0, 124.07),
                                                         c.block))
              if c.arm == "far" and c.point == "p1" else c for c in cells]
    assert "  train p1: step -0.93 ms [-0.93, -0.93] measured (-0.7% of 125.0 ms)" in " ".join(arithmetic(hidden, "near"))
    # arms at the same delay (an A/A): nothing to explain
    same = [Cell(c.workload, c.point, "near~aa" if c.arm == "far" else c.arm,
                 _rec("collectives", 500.0, 1.0)) for c in cells if c.workload == "allreduce-1k"]
    assert arithmetic(same, "near") == []


def test_the_added_times_interval_covers_and_pairs():
    """Simulated delay studies through latency.added: 6 blocks whose drift (sd 20 ms) both arms
    share, runs of sd 4 ms, a true +10 ms: the paired 95% interval covers +10 in >= 93% of 1000
    studies, and is narrower than the unpaired one would be (drift cancels within a block)."""
    import numpy as np

    from analysis.latency import added
    from helpers.binomial import at_least

    rng = np.random.default_rng(5731)
    covered, widths = 0, []
    for _ in range(1000):
        drift = rng.normal(0, 20, 6)
        base = {b: [100 + drift[b] + rng.normal(0, 4)] for b in range(6)}
        arm = {b: [110 + drift[b] + rng.normal(0, 4)] for b in range(6)}
        x = added(arm, base)
        covered += x.paired and x.lo <= 10 <= x.hi
        widths.append(x.hi - x.lo)
    assert at_least(covered, 1000, 0.93), covered
    unpaired = added({None: [v for vs in arm.values() for v in vs]}, {None: [v for vs in base.values() for v in vs]})
    assert not unpaired.paired and np.median(widths) < 0.5 * (unpaired.hi - unpaired.lo)


def test_sglang_counts_its_own_collectives_per_token():
    """SGLang's decode step of a 2-layer Llama waits for 7 small collectives (2 per layer, the
    embedding's all_reduce, the logits' all_gather, the scheduler's request broadcast): at +8 ms
    each, +56 ms predicted; +50 measured reads 0.89. An engine without a count says so."""
    cells = []
    for arm, d, ar, tpot in (("near", 500.0, 1.0, 30.0), ("far", 2500.0, 9.0, 80.0)):
        for adapter, name in (("sglang", "sglang-tp2"), ("vllm", "vllm-tp2")):
            rec = _rec("inference", d, tpot)
            rec["server"]["adapter"] = adapter
            cells += [Cell(name, "c1", arm, rec)]
        cells.append(Cell("allreduce-1k", "-", arm, _rec("collectives", d, ar)))
    lines = arithmetic(cells, "near")
    one = "[no interval: one run a side]"
    assert (f"  sglang-tp2 c1: TPOT +50.00 ms {one}, TTFT +50.00 ms {one} measured; arithmetic: 7 collectives per "
            "token (2 x 2 layers' all_reduces + the embedding's all_reduce + the logits' all_gather + the scheduler's "
            "request broadcast, TP=2) x +8.000 ms = +56.00 ms (measured/arithmetic 0.89)") in lines
    assert (f"  vllm-tp2 c1: TPOT +50.00 ms {one}, TTFT +50.00 ms {one} measured; no count of vllm's collectives per "
            "decode step here") in lines


def test_an_emulated_servers_host_link_address_is_not_identity():
    """Each emulated run's server listens on its host link's end, a /30 picked from those that
    concurrent emulations leave free; two runs of one cell that got different ones are one point."""
    from analysis.guard import point_key

    a, b = _rec("inference", 500.0, 20.0), _rec("inference", 500.0, 21.0)
    a["config"]["server"], b["config"]["server"] = {"host": "10.78.0.2", "tp": 2}, {"host": "10.78.1.2", "tp": 2}
    assert point_key(a) == point_key(b)
    b["config"]["server"]["tp"] = 1
    assert point_key(a) != point_key(b)


def test_sensitivity_groups_as_the_verdicts_do_and_reads_no_slope_from_jitter():
    """Near and far TP=2 runs whose kept topologies gave their servers different host-link
    addresses are one point (the issue's case: grouped by config, near's 'axis' spanned 495-500 us
    and far was dropped): one positive TPOT slope. Runs only 5 us apart have no delay axis."""
    recs = []
    for arm_us, host, tpot in ((495.0, "10.78.0.2", 24.0), (500.0, "10.78.0.2", 24.2), (498.0, "10.78.0.2", 23.9),
                               (5495.0, "10.78.1.2", 120.0), (5500.0, "10.78.1.2", 121.0), (5490.0, "10.78.1.2", 119.5)):
        recs.append(_rec("inference", arm_us, tpot, server={"host": host, "tp": 2}))
    (tpot,) = [s for s in slopes(recs) if s.unit == "tpot"]
    b, lo, hi = tpot.per_ms_delay
    assert tpot.n == 6 and 0 < lo < b < hi and b == pytest.approx(96.3 / 5.0, rel=0.01), tpot
    assert slopes(recs[:3]) == []  # 495-500 us: the line's jitter, not an axis


def test_sensitivity_intervals_cover_with_unequal_runs_and_spreads():
    """Simulated delay studies through latency.slopes' intervals (true slope +19.3 ms per ms):
    two levels with 3 runs of sd 5 ms at 0.5 ms and 7 of sd 0.5 ms at 5.5 ms (Welch per level),
    and three levels at spreads 1:3:6 (HC3): each covers >= 93% of 400 studies."""
    from analysis.latency import _intervals
    from helpers.binomial import at_least

    rng = np.random.default_rng(5743)
    for levels, ns, sds in (((0.5, 5.5), (3, 7), (5.0, 0.5)), ((0.5, 2.5, 5.5), (4, 4, 4), (1.0, 3.0, 6.0))):
        covered = 0
        for _ in range(400):
            d = np.concatenate([lv + rng.normal(0, 0.002, n) for lv, n in zip(levels, ns)])
            y = np.concatenate([40 + 19.3 * lv + rng.normal(0, sd, n) for lv, n, sd in zip(levels, ns, sds)])
            x = np.column_stack([np.ones(len(y)), d])
            beta, *_ = np.linalg.lstsq(x, y, rcond=None)
            _, lo, hi = _intervals(x, y, ["delay"], d, None, beta, 0.95)["delay"]
            covered += lo <= 19.3 <= hi
        assert at_least(covered, 400, 0.93), (levels, covered)


def test_slopes_recover_a_known_line():
    """step = 40 + 10 x delay(ms) + 8 x (s/Gbit), two runs per setting with ±0.1 ms of noise:
    the fit returns 10 and 8 with intervals that hold them."""
    recs = []
    for d in (500.0, 1000.0, 2500.0):
        for rate, inv in (("1gbit", 1.0), ("100mbit", 10.0)):
            for e in (0.1, -0.1):
                recs.append(_rec("pretrain", d, 40 + 10 * d / 1e3 + 8 * inv + e, rate=rate))
    (s,) = slopes(recs)
    assert s.unit == "step" and s.n == 12 and s.point is None
    for r in recs:
        r["config"]["train"] = {"micro_batch_size": 8}
    assert [x.point for x in slopes(recs)] == ["mb=8"]       # what tells it from its siblings
    ar = [_rec("collectives", d, 1.0 + d / 1e3 + e) for d in (500.0, 2500.0) for e in (0.1, -0.1)]
    assert [(x.point, x.unit) for x in slopes(ar)] == [("1024 B", "all_reduce")]
    b, lo, hi = s.per_ms_delay
    assert b == pytest.approx(10.0, abs=1e-6) and lo < 10 < hi and hi - lo < 0.5
    b, lo, hi = s.per_inv_gbit
    assert b == pytest.approx(8.0, abs=1e-6) and lo < 8 < hi
    assert s.base_ms == pytest.approx(40 + 5 + 8)   # at 0.5 ms and 1 Gbit/s
    added, lo, hi = s.what_if(delay_ms=0.1)
    assert added == pytest.approx(1.0) and lo < 1.0 < hi
    # one axis only: the other is not estimable, and the what-if says so
    (s,) = slopes([r for r in recs if r["config"]["fabric"]["emulate"]["rate"] == "1gbit"])
    assert s.per_inv_gbit is None and s.what_if(inv_gbit=1.0) is None and s.per_ms_delay[0] == pytest.approx(10.0)


def test_sensitivity_command(tmp_path):
    folder = tmp_path / "res" / "run" / "records"
    folder.mkdir(parents=True)
    for k, (d, e) in enumerate([(500.0, 0.1), (500.0, -0.1), (2500.0, 0.1), (2500.0, -0.1)]):
        (folder / f"r{k}.json").write_text(json.dumps(_rec("pretrain", d, 47 + 16.5 * d / 1e3 + e)))
    (tmp_path / "empty").mkdir()
    cmd = [sys.executable, "-m", "workloads.commands.cli", "sensitivity"]
    p = subprocess.run(cmd + [str(tmp_path / "res"), "--delay", "100us"], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "pretrain - step: 55.250 ms at the nearest, fastest point (n=4): +16.500 ms per ms of one-way delay" in p.stdout
    assert "what if: +1.650 ms" in p.stdout
    for argv, msg in [([str(tmp_path / "nope")], "is not a folder"), ([str(tmp_path / "empty")], "no result records found"),
                      ([str(tmp_path / "res"), "--rate", "1gbit"], "--rate and --from-rate go together"),
                      ([str(tmp_path / "res"), "--delay=-1ms"], "--delay='-1ms' is not a delay")]:
        p = subprocess.run(cmd + argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_the_arithmetic_is_in_compare_and_the_report_and_labels_tell_points_apart(tmp_path):
    """A delay study's records (near 0.5 ms, far 5.5 ms one way, 4 blocks): two collectives
    workloads of one entry (1 KiB and 4 MiB) and a training point whose blocks disagree. Compare's
    lines and the report (md, html, json) carry the arithmetic; the training point, not called,
    claims no count of waiting; the two collectives verdicts carry their workload names."""
    from analysis import verdicts
    from analysis.load import load_table
    from analysis.report import write_report
    from helpers.records import coll, train_record
    from workloads.core.records import write_record

    rng = np.random.default_rng(5732)
    for b in range(4):
        for arm, d in (("near", 500.0), ("far", 5500.0)):
            st = lambda w: {"id": "lat", "arm": arm, "block": b, "workload": w, "design": "abba",  # noqa: E731
                            "baseline": "near"}
            far = arm == "far"
            for w, size, t_ms in (("allreduce-1k", 1024, 3.0 + 20 * far), ("allreduce-4m", 4 << 20, 40.0 + 14 * far)):
                rec = coll(arm, b, world=2, busbw=1.0 / t_ms)
                rec["rows"] = [{**r, "size": size, "in_place": {"busbw": 1.0 / t_ms, "time_us": 1e3 * t_ms * (1 + rng.normal(0, 0.02))}}
                               for r in rec["rows"] if r["op"] == "all_reduce"][:1]
                rec["metrics"] = {"all_reduce/avg_busbw(GB/s)": 1.0 / t_ms * (1 + rng.normal(0, 0.02))}
                rec["config"]["collectives"]["minbytes"] = size
                rec.update(study=st(w), fabric={"name": arm, "delay": _delay(d)}, run_id=f"{w}-{arm}-{b}",
                           schema="fabricbench.record/1")
                write_record(tmp_path / f"{w}-{arm}-{b}" / "records", rec, "r")
            step = 400.0 + rng.normal(0, 150)
            rec = train_record(arm, 32 / (step / 1e3), mb=16, trial=b, run_id=f"t-{arm}-{b}")
            rec["metrics"]["iteration_time(s)"] = step / 1e3
            rec.update(study=st("train-p1"), fabric={"name": arm, "delay": _delay(d), "backend": "gloo"})
            write_record(tmp_path / f"train-{arm}-{b}" / "records", rec, "r")
    result = verdicts.judge(load_table([str(tmp_path)]), "near", (), where=str(tmp_path))
    text = "\n".join(verdicts.lines(result, dirs=[str(tmp_path)]))
    labels = [p.label for p, c in result.comparisons if c.primary and p.runs[0].workload == "collectives"]
    assert len(labels) == 2 and len(set(labels)) == 2 and any("allreduce-1k" in x for x in labels), text
    assert "latency arithmetic, far vs near: +5.000 ms one way" in text, text
    assert re.search(r"one all_reduce of 1024 B \(allreduce-1k, the timed block's time per call\): \+(19|20)\.\d+ ms \[", text), text
    train_line = next(x for x in text.splitlines() if x.startswith("  train-p1 -: step"))
    assert "not called (inconclusive), so no count of waiting is claimed" in train_line, text
    report = write_report(load_table([str(tmp_path)]), result, tmp_path / "report")
    assert "Latency arithmetic" in report.markdown.read_text() and "latency arithmetic, far vs near" in report.markdown.read_text()
    assert "round trips of the added delay" in report.html.read_text()
    assert any("train-p1 -: step" in x for x in json.loads(report.json.read_text())["latency_arithmetic"])
