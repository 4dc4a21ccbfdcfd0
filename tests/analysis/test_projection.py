"""The alpha-beta calibration and its projections (analysis/projection/, `fabricbench model`),
pinned with worked values on records built from known parameters."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import nccl_model as nm
from analysis import projection as pj
from helpers import FIXTURES, REPO, child_env
from workloads.core.errors import UsageError

ALPHA, B = 200e-6, 12.5e6          # 200 us per step, 12.5 MB/s of bus bandwidth
SIZES = [1 << 16, 1 << 18, 1 << 20, 1 << 22]


def _rec(p: int, block: int, *, fabric="emu-100m", commit="c0ffee", noise=None, alpha=ALPHA, bw=B,
         created="2026-11-28T10:00:00+0000", ops=("all_reduce", "all_gather")) -> dict:
    """One collectives record at p ranks whose times follow the model, times (1 + noise(size, op))."""
    rows = []
    for op in ops:
        for s in SIZES:
            t = pj.model_time(op, p, s, alpha, 1 / bw) * (1 + (noise(s, op) if noise else 0.0))
            cell = {"time_us": t * 1e6}
            rows.append({"op": op, "size": s, "group_size": p, "in_place": cell,
                         "out_of_place": None if op == "all_reduce" else cell})
    return {"workload": "collectives", "status": "ok", "run_id": f"n{p}", "record_id": f"{p}-{block}-{fabric}",
            "created": created, "config": {"trial": block, "fabric": {"name": fabric}},
            "fabric": {"name": fabric}, "world": {"world_size": p}, "rows": rows,
            "study": {"id": "s1", "block": block},
            "fingerprint": {"git": {"commit": commit, "dirty_hash": None}},
            "line_rate": {"payload_per_comm(GB/s)": 0.011955}}


def _wobble(block: int, p: int):
    """A deterministic +-3% block effect (some blocks slower, some faster), alike at every size."""
    return lambda s, op: 0.03 * math.sin(1.7 * block + 0.9 * p + (s.bit_length() % 3))


def _recs(scales=(2, 4), blocks=3, **kw) -> list[tuple[Path, dict]]:
    return [(Path(f"/r/n{p}/records/{b}.json"), _rec(p, b, noise=_wobble(b, p), **kw))
            for p in scales for b in range(blocks)]


def test_ring_terms_and_the_model_time_worked():
    assert pj.terms("all_reduce", 8) == (14, 1.75)
    assert pj.terms("all_gather", 8) == (7, 0.875)
    assert pj.terms("reduce_scatter", 2) == (1, 0.5)
    # 4-rank all_reduce of 1 MiB at 100 us per step and 12.5 MB/s:
    # 6 x 100 us + 1048576 x 1.5 / 12.5e6 = 0.0006 + 0.12582912 = 0.12642912 s
    assert pj.model_time("all_reduce", 4, 1 << 20, 100e-6, 1 / 12.5e6) == pytest.approx(0.12642912)
    # G(p) is nccl-tests' busbw factor: a large call's busbw approaches B at any scale
    big = 1 << 34
    t = pj.model_time("all_reduce", 64, big, 100e-6, 1 / B)
    assert big / t * pj.terms("all_reduce", 64)[1] == pytest.approx(B, rel=1e-3)


def test_the_fit_recovers_noise_free_parameters_exactly():
    recs = [(Path(f"/r/{p}.json"), _rec(p, 0)) for p in (2, 4)]
    cal = pj.fit(recs, boot=50)
    for op in ("all_reduce", "all_gather"):
        c = cal["ops"][op]
        assert c["alpha_s"] == pytest.approx(ALPHA, rel=1e-9)
        assert c["bandwidth_GBps"] == pytest.approx(B / 1e9, rel=1e-9)
        assert c["holdout"][0]["p"] == 4 and c["holdout"][0]["from"] == [2]
        assert max(abs(h["log_error"]) for h in c["holdout"]) < 1e-9
        assert c["uncertainty"].startswith("residuals")        # one block per scale: said so
    assert cal["schema"] == pj.SCHEMA and cal["fabric"] == "emu-100m" and cal["code"]["commit"] == "c0ffee"
    assert cal["records"] == ["/r/2.json", "/r/4.json"]
    # exact data: the projection to 8 ranks is the formula's value, its interval of zero width
    pr = pj.project(cal, "all_reduce", 8, 1 << 20)
    assert pr.time_s == pytest.approx(14 * ALPHA + (1 << 20) * 1.75 / B)
    assert pr.low_s == pytest.approx(pr.time_s) and pr.high_s == pytest.approx(pr.time_s)
    assert pr.label == "extrapolated"


def test_block_noise_gives_block_intervals_that_cover_the_truth():
    cal = pj.fit(_recs(blocks=4), boot=200)
    c = cal["ops"]["all_reduce"]
    assert c["uncertainty"] == "blocks" and c["blocks"] == {"2": 4, "4": 4}
    lo, hi = c["alpha_90"]
    assert lo <= ALPHA * 1.05 and hi >= ALPHA * 0.95
    blo, bhi = c["bandwidth_GBps_90"]
    assert blo < B / 1e9 * 1.03 and bhi > B / 1e9 * 0.97
    assert c["noise_log_sd"]["2"] == pytest.approx(0.02, abs=0.015)
    # the truth at 8 ranks lies inside the projected 90% intervals
    for op in ("all_reduce", "all_gather"):
        for s in SIZES:
            pr = pj.project(cal, op, 8, s)
            assert pr.low_s <= pj.model_time(op, 8, s, ALPHA, 1 / B) <= pr.high_s


def test_noise_grows_with_scale_as_stated():
    c = {"noise_log_sd": {"2": 0.05, "8": 0.1}}
    assert pj.noise_at(c, 8) == pytest.approx(0.1)
    assert pj.noise_at(c, 4) == pytest.approx(0.1)                      # never below the largest scale's
    assert pj.noise_at(c, 512) == pytest.approx(0.1 * math.sqrt(3))     # sqrt(ln 512 / ln 8) = sqrt(3)
    assert pj.noise_at({"noise_log_sd": {"2": None}}, 64) == 0.0


def test_conformal_quantile_worked():
    assert pj._quantile([float(x) for x in range(1, 10)], 0.9) == 9.0   # ceil(10 x 0.9) = 9th of 9
    assert pj._quantile([1.0, 2.0, 3.0], 0.9) == 3.0                    # fewer points than 1/(1-q): the largest
    assert pj._quantile([float(x) for x in range(1, 21)], 0.9) == 19.0  # ceil(21 x 0.9) = 19


def test_model_form_margin_grows_with_the_distance_beyond_the_data():
    # 4 ranks measured 10% slower than the model at every size: 4-from-2 errs by ln(1.1) per doubling
    recs = [(Path("/r/2.json"), _rec(2, 0)),
            (Path("/r/4.json"), _rec(4, 0, noise=lambda s, op: 0.10))]
    cal = pj.fit(recs, boot=50)
    c = cal["ops"]["all_gather"]
    mf = c["model_form"]["beyond"]
    # one held-out scale is one unit, whatever its sizes: its largest error, at the level 1/2 it attains
    assert mf["units"] == {"4": pytest.approx(math.log(1.1), rel=1e-6)} and mf["level"] == 0.5
    assert mf["margin_log"] == pytest.approx(math.log(1.1), rel=1e-6)
    at8, at16 = pj.project(cal, "all_gather", 8, 1 << 20), pj.project(cal, "all_gather", 16, 1 << 20)
    assert at8.label == "extrapolated" and at16.label == "model-only"   # 16 > 2 x 4
    assert pj.project(cal, "all_gather", 3, 1 << 20).label == "interpolated"
    assert pj.project(cal, "all_gather", 4, 1 << 20).label == "measured"
    # 8 is 1 doubling past 4, 16 is 2: the allowance scales with it, a named term apart from the PI
    assert at8.form_log == pytest.approx(mf["margin_log"]) and at16.form_log == pytest.approx(2 * mf["margin_log"])
    assert (at8.form_level, at8.form_units) == (0.5, 1)
    lo, hi = at8.with_form
    assert lo == pytest.approx(at8.low_s / 1.1) and hi == pytest.approx(at8.high_s * 1.1)
    line = pj.projection_line(at8)
    assert "(90% PI, parameters and noise); model form +-10.0% from 1 held-out scale (level 50%)" in line
    assert "model-only" in pj.projection_line(at16)


def test_a_model_only_interval_is_held_above_the_schedules_floor_or_not_printed():
    cal = pj.fit(_recs(blocks=3), boot=100)
    c = cal["ops"]["all_reduce"]
    # what the records measured: no latency floor (no sampled calls), the TCP payload ceiling 0.011955 GB/s
    assert c["latency_floor"] == {} and cal["payload_GBps"] == 0.011955
    pr = pj.project(cal, "all_reduce", 512, 16 << 20)
    # worked: the bytes alone at the ceiling, 2 x 511/512 x 16 MiB / 11.955 MB/s = 2.8011 s
    floor = 2 * 511 / 512 * (16 << 20) / 11.955e6
    assert pr.label == "model-only" and pr.floor_s == pytest.approx(floor, rel=1e-9)
    assert pr.low_s >= floor and pr.with_form[0] >= floor
    assert pr.size / pr.low_s * pj.terms("all_reduce", 512)[1] <= 0.011955e9 * (1 + 1e-9)   # busbw capped by the line
    # nothing measured to hold it up: no interval, and said so
    bare = cal | {"payload_GBps": None, "line_rate_GBps": None, "latency_floor": None}
    none = pj.project(bare, "all_reduce", 512, 16 << 20)
    assert math.isnan(none.low_s) and "no interval" in pj.projection_line(none)
    assert "cannot tell" in pj.compare(none, none)
    assert not math.isnan(pj.project(bare, "all_reduce", 8, 16 << 20).low_s)      # 2x: extrapolated, printed


def test_projected_comparison_in_verdict_words_and_an_aa_control():
    slow = pj.fit(_recs(blocks=3, fabric="emu-10m", bw=B / 4), boot=100)
    fast = pj.fit(_recs(blocks=3), boot=100)
    a, b = pj.project(fast, "all_reduce", 512, 16 << 20), pj.project(slow, "all_reduce", 512, 16 << 20)
    line = pj.compare(a, b)
    assert "at 512 ranks, all_reduce 16 MiB: emu-100m is faster than emu-10m by" in line
    assert "cannot tell" not in line and "model-only" in line
    ratio = b.time_s / a.time_s - 1
    assert f"{100 * ratio:.1f}%" in line
    # A/A: the same fabric against itself is never called
    assert "cannot tell at that scale" in pj.compare(a, pj.project(fast, "all_reduce", 512, 16 << 20))
    # order does not change the sentence's number
    assert f"{100 * ratio:.1f}%" in pj.compare(b, a)


def test_bad_input_is_named():
    with pytest.raises(UsageError, match="one scale only"):
        pj.fit([(Path("/r/a.json"), _rec(2, 0)), (Path("/r/b.json"), _rec(2, 1))])
    with pytest.raises(UsageError, match="2 fabrics .*--fabric"):
        pj.fit(_recs() + _recs(fabric="emu-10m"))
    assert pj.fit(_recs() + _recs(fabric="emu-10m"), fabric="emu-10m", boot=50)["fabric"] == "emu-10m"
    with pytest.raises(UsageError, match="2 versions of the code"):
        pj.fit(_recs(scales=(2,)) + _recs(scales=(4,), commit="beef"))
    with pytest.raises(UsageError, match="no ok collectives records"):
        pj.fit([(Path("/r/x.json"), {"workload": "pretrain", "status": "ok"})])
    cal = pj.fit(_recs(), boot=50)
    with pytest.raises(UsageError, match="older than these records"):
        pj.check_against(cal, [(Path("/r/8.json"), _rec(8, 0, commit="beef", created="2099-01-01T00:00:00+0000"))])
    with pytest.raises(UsageError, match="of emu-10m, the calibration of emu-100m"):
        pj.check_against(cal, [(Path("/r/8.json"), _rec(8, 0, fabric="emu-10m"))])
    with pytest.raises(UsageError, match="every scale must be 2"):
        pj.parse_ranks("1,8")
    with pytest.raises(UsageError, match="whole numbers"):
        pj.parse_ranks("64,lots")


def test_check_against_held_out_records():
    cal = pj.fit(_recs(blocks=3), boot=100)
    rows = pj.check_against(cal, [(Path("/r/8.json"), _rec(8, 0, noise=_wobble(0, 8)))])
    assert len(rows) == 2 * len(SIZES) and all(r["inside"] for r in rows)
    assert pj.check_summary(rows).startswith(f"{len(rows)} of {len(rows)} measured cells inside their 90% PI")


def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "workloads.commands.cli", "model", *map(str, args)], cwd=cwd,
                          env=child_env(), capture_output=True, text=True, timeout=120)


def _write(folder: Path, recs: list[tuple[Path, dict]]) -> Path:
    for i, (_, r) in enumerate(recs):
        d = folder / f"run{i}" / "records"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"collectives-{i}.json").write_text(json.dumps(r))
    return folder


def test_cli_fit_project_check_and_one_line_errors(tmp_path):
    res = _write(tmp_path / "res", _recs(blocks=3))
    cal = tmp_path / "cal.json"
    r = _cli("fit", res, "--out", cal, "--bootstrap", 100)
    assert r.returncode == 0, r.stderr
    assert "all_reduce (ring" in r.stdout and "held out: 4 from 2" in r.stdout
    assert json.loads(cal.read_text())["fabric"] == "emu-100m"
    r = _cli("project", cal, "--ranks", "8,512", "--sizes", "1M", "--ops", "all_reduce")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and "at 8 ranks" in lines[0] and lines[0].endswith("extrapolated")
    assert "model-only" in lines[1]
    r = _cli("project", cal, cal, "--ranks", "64", "--sizes", "16M", "--ops", "all_gather")
    assert r.returncode == 0 and "cannot tell at that scale" in r.stdout
    # bad input: one line on stderr, non-zero, nothing written
    one = _write(tmp_path / "one", [(None, _rec(2, 0)), (None, _rec(2, 1))])
    for args, words in [(("fit", one), "one scale only"),
                        (("fit", tmp_path / "nowhere"), "is not a folder"),
                        (("project", tmp_path / "res" / "run0" / "records" / "collectives-0.json", "--ranks", "8"),
                         "is not a fabricbench.calibration/2"),
                        (("project", cal, "--ranks", "eight"), "whole numbers")]:
        r = _cli(*args)
        assert r.returncode != 0 and r.stderr.count("\n") == 1 and words in r.stderr, (args, r.stderr)
    assert not (one / "calibration-emu-100m.json").exists()


def _training(p0=2, fabric="emu-100m", commit="c0ffee", took=0.07) -> dict:
    """A training record: 1 s steps, 80% of them with a gradient all_reduce of 231168 floats in
    flight, each call taking `took` s from its launch on rank 0 (the rest: other collectives and
    host work, which CommTimer's union also counts)."""
    return {"workload": "pretrain", "status": "ok", "fabric": {"name": fabric}, "world": {"world_size": p0},
            "fingerprint": {"git": {"commit": commit, "dirty_hash": None}},
            "metrics": {"iteration_time(s)": 1.0, "iteration_time_std(s)": 0.0, "comm_share": 0.8, "measured_steps": 10},
            "samples": {"comm_calls": [[["all_reduce", "float32", 231168, p0, 0.1, 0.1 + took]]] * 3}}


def test_step_time_projection_worked():
    cal = pj.fit([(Path(f"/r/{p}.json"), _rec(p, 0)) for p in (2, 4)], boot=50)
    sp = pj.project_step(cal, _training(), 4)
    # the bucket: 924672 B. At 2 ranks the sweep measured it between its 256 KiB and 1 MiB cells
    # (the model: 2 x 200 us + 924672 / 12.5e6 = 0.07437376 s); at 4 ranks the model gives 6 x 200 us
    # + 1.5 x 924672 / 12.5e6 = 0.11216064 s. The 0.2 s without a collective in flight stays, the
    # 0.8 s with one scales by their ratio (~1.508)
    base = pj.measured_at(cal["ops"]["all_reduce"], 2, 924672)
    assert base == pytest.approx(0.07437376, rel=2e-3)
    assert sp.step_s == pytest.approx(0.2 + 0.8 * 0.11216064 / base, rel=1e-6)
    assert sp.comm_s == pytest.approx(0.8 * 0.11216064 / base, rel=1e-6)
    assert sp.label == "measured" and sp.ranks == 2
    assert sp.low_s == pytest.approx(sp.step_s) and sp.high_s == pytest.approx(sp.step_s)   # exact data, no spread
    assert f"training step at 4 ranks: {sp.step_s * 1e3:.1f} ms" in pj.step_line(sp)
    # the run's calls took twice what the sweep measured for them (a rank waited for its peer): the
    # centre and the high end stay, the low end prices the step without that wait
    waited = pj.project_step(cal, _training(took=2 * base), 4)
    assert (waited.step_s, waited.high_s) == (pytest.approx(sp.step_s), pytest.approx(sp.high_s))
    assert waited.low_s == pytest.approx(0.2 + 0.8 * 0.11216064 / (2 * base), rel=1e-6)
    # log-log between measured cells: 1 s at 1000 B and 4 s at 4000 B give 2 s at 2000 B
    c = {"cells": [{"p": 2, "size": 1000, "time_s": 1.0}, {"p": 2, "size": 4000, "time_s": 4.0}]}
    assert pj.measured_at(c, 2, 2000) == pytest.approx(2.0)
    assert pj.measured_at(c, 2, 8000) is None and pj.measured_at(c, 4, 2000) is None
    assert pj.project_step(cal, _training(), 64).label == "model-only"
    with pytest.raises(UsageError, match="ran on emu-10m"):
        pj.project_step(cal, _training(fabric="emu-10m"), 4)
    with pytest.raises(UsageError, match="other code"):
        pj.project_step(cal, _training(commit="beef"), 4)
    tp = _training()
    tp["samples"] = {"comm_calls": [[["all_reduce", "float32", 1024, 1, 0.0, 0.1]]]}
    tp["world"] = {"world_size": 4}
    with pytest.raises(UsageError, match=r"groups of \[1\] ranks"):
        pj.project_step(cal, tp, 8)
    with pytest.raises(UsageError, match="ok training record"):
        pj.project_step(cal, {"workload": "collectives", "status": "ok"}, 4)


def test_an_emulated_fabric_is_its_settings_too():
    def at(rate):
        recs = _recs()
        for _, r in recs:
            r["config"]["fabric"]["emulate"] = {"nodes": r["world"]["world_size"], "rate": rate, "mtu": 1500}
        return recs
    assert pj.fabric_of(at("10mbit")[0][1]) == "emu-100m (rate=10mbit)"        # the node count is the scale
    with pytest.raises(UsageError, match=r"2 fabrics \(emu-100m \(rate=100mbit\); emu-100m \(rate=10mbit\)\)"):
        pj.fit(at("10mbit") + at("100mbit"))
    with pytest.raises(UsageError, match="2 fabrics"):
        pj.fit(at("10mbit") + at("100mbit"), fabric="emu-100m")             # the name alone does not pick one
    assert pj.fit(at("10mbit") + at("100mbit"), fabric="emu-100m (rate=10mbit)", boot=50)["fabric"].endswith("10mbit)")


def test_emulated_nodes_share_the_hosts_cores():
    recs = [(Path(f"/r/{p}.json"), _rec(p, 0)) for p in (2, 4)]
    for _, r in recs:
        r["config"]["fabric"]["emulate"] = {"nodes": r["world"]["world_size"], "rate": "10mbit"}
    cal = pj.fit(recs, boot=50)
    rec = _training() | {"config": {"fabric": {"emulate": {"rate": "10mbit"}}}, "fingerprint": {
        "git": {"commit": "c0ffee", "dirty_hash": None}, "cpu_count": 2, "cpu_affinity": 2}}
    assert pj.host_share(rec, 2) == 1.0 and pj.host_share(rec, 4) == 2.0 and pj.host_share(rec, 8) == 4.0
    assert pj.host_share(_training(), 8) == 1.0                         # real nodes: compute stays
    # the 0.2 s of compute doubles when 4 ranks share 2 cores
    base = pj.measured_at(cal["ops"]["all_reduce"], 2, 924672)
    assert pj.project_step(cal, rec, 4).step_s == pytest.approx(0.4 + 0.8 * 0.11216064 / base, rel=1e-6)


def test_the_reports_projection_section(tmp_path):
    from analysis.projection import report as projection_report
    from analysis.report import Section, to_html, to_markdown

    assert projection_report.blocks(tmp_path, tmp_path / "plots") == []          # no calibration: no section
    cal = pj.fit(_recs(blocks=3), boot=50)
    (tmp_path / "calibration-emu-100m.json").write_text(json.dumps(cal))
    blocks = projection_report.blocks(tmp_path, tmp_path / "plots")
    table = next(b for b in blocks if b[0] == "table")
    assert table[1] == projection_report.HEAD and [r[0] for r in table[2]] == ["all_gather", "all_reduce"]
    assert "4 from 2: median" in table[2][1][5] and "at 8 ranks" in table[2][1][6]
    figures = [b for b in blocks if b[0] == "figure"]
    assert len(figures) == 2 and all(f[1].stat().st_size > 1000 for f in figures)
    md = to_markdown("t", [Section("Projection to scale", blocks)], tmp_path)
    assert "## Projection to scale" in md and "model-only" in md and "projection-calibration-emu-100m-all_reduce.png" in md
    assert "<img" in to_html("t", [Section("Projection to scale", blocks)])


# --- NCCL's own cost model from its tuning table (analysis/nccl_model.py): the fixture's worked
# values (tests/fixtures/nccl_logs/nccl_2.30_tuning_table, from NCCL 2.30.7's tuning.cc for the
# system its header states)

NCCL_LOG = FIXTURES / "nccl_logs" / "nccl_2.30_tuning_table" / "nccl.h0.9100.log"

# the table's older form (tuning.cc before the three-algorithm blocks: "Latency/AlgBw |" and
# " %7s/%6s |" per column, "%13s |" and "%8.1f/%6.1f |" per function, three algorithms)
OLD = """\
n1:1:1 [0] NCCL INFO Latency/AlgBw |    Tree/    LL |    Tree/ LL128 |    Tree/Simple |    Ring/    LL |    Ring/ LL128 |    Ring/Simple | CollNet/    LL | CollNet/ LL128 | CollNet/Simple |
n1:1:1 [0] NCCL INFO  Max NThreads |            512 |            640 |            512 |            512 |            640 |            256 |              0 |              0 |            512 |
n1:1:1 [0] NCCL INFO     AllReduce |    14.4/   1.2 |    20.9/   0.0 |    62.4/   4.5 |    13.5/   1.5 |    20.0/   0.0 |    44.2/   6.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
n1:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 4 cudaDev 0 busId 1000 - Init COMPLETE
"""


def test_the_2_30_table_is_read_with_its_rank_count():
    t = nm.read(NCCL_LOG)
    assert t["nranks"] == 8 and t["file"] == str(NCCL_LOG)
    ar = t["cells"]["AllReduce"]
    assert ar["Ring/Simple"] == (204.4, 13.7) and ar["Tree/Simple"] == (92.4, 11.0) and ar["Ring/LL"] == (76.6, 6.9)
    assert t["cells"]["AllGather"]["Ring/Simple"] == (106.4, 27.4)
    assert len(ar) == 21                                   # seven algorithms x three protocols, three blocks


def test_ring_terms_worked():
    t = nm.read(NCCL_LOG)
    r = nm.ring_terms(t, "all_reduce")
    # 204.4 us over L(8) = 14 steps; bus bandwidth = algbw x G(8) = 13.7 x 14/8
    assert r["alpha_s"] == pytest.approx(14.6e-6) and r["bandwidth_GBps"] == pytest.approx(23.975)
    g = nm.ring_terms(t, "all_gather")
    assert g["alpha_s"] == pytest.approx(106.4e-6 / 7) and g["bandwidth_GBps"] == pytest.approx(27.4 * 7 / 8)
    assert nm.ring_terms(t, "alltoall") is None


def test_nccls_time_is_its_fastest_algorithm_worked():
    t = nm.read(NCCL_LOG)
    # 16 MiB: ring/Simple with the multi-node plateau, 1.4 x 204.4 us + 16777216 / 13.7e9 = 1.51077 ms,
    # against tree/Simple's 92.4 us + 16777216 / 11.0e9 = 1.52524 ms
    assert nm.nccl_time(t, "all_reduce", 16 << 20) == pytest.approx(1.4 * 204.4e-6 + (16 << 20) / 13.7e9)
    # 1 KiB: tree/LL, 36.8 us + 1024 / 2.9e9
    assert nm.nccl_time(t, "all_reduce", 1024) == pytest.approx(36.8e-6 + 1024 / 2.9e9)


def test_the_older_table_form():
    (t,) = nm.parse_tuning(OLD)
    assert t["nranks"] == 4 and t["cells"]["AllReduce"]["Ring/Simple"] == (44.2, 6.0)
    assert nm.ring_terms(t, "all_reduce")["alpha_s"] == pytest.approx(44.2e-6 / 6)


def test_a_log_without_a_table_is_named(tmp_path):
    (tmp_path / "a.log").write_text("h:1:1 [0] NCCL INFO NCCL version 2.30.7+cuda13.0\n")
    with pytest.raises(UsageError, match="no tuning table in it; rerun with NCCL_DEBUG=INFO"):
        nm.read(tmp_path)
    with pytest.raises(UsageError, match="no NCCL log there"):
        nm.read(tmp_path / "missing.log")


def test_the_check_beside_a_calibration_and_the_cli(tmp_path):
    # records made from NCCL's own ring terms at 2, 4 and 8 ranks: the fit finds them, and NCCL's
    # ring/Simple at 8 ranks agrees with the fit; NCCL's fastest algorithm there is its tree (92.4
    # us, 11.0 GB/s), so its own time is below the ring's measured cells
    a, bw = 14.6e-6, 23.975e9
    recs = [(None, _rec(p, b, alpha=a, bw=bw)) for p in (2, 4, 8) for b in range(2)]
    cal = pj.fit(recs, boot=50)
    table = nm.read(NCCL_LOG)
    chk = nm.check(cal, table)
    ar = chk["ops"]["all_reduce"]
    assert ar["alpha_ratio"] == pytest.approx(1.0, rel=1e-3) and ar["bandwidth_ratio"] == pytest.approx(1.0, rel=1e-3)
    # the third of four sorted errors; at 1 MiB: tree 92.4 us + 1048576 / 11e9 = 187.7 us against the
    # ring's 14 x 14.6 us + 1048576 x 14/8 / 23.975e9 = 280.9 us, -33.2%
    errs = sorted(nm.nccl_time(table, "all_reduce", s) / pj.model_time("all_reduce", 8, s, a, 1 / bw) - 1 for s in SIZES)
    assert ar["cells"] == 4 and ar["median_error_vs_measured"] == pytest.approx(errs[2])
    assert nm.nccl_time(table, "all_reduce", 1 << 20) == pytest.approx(92.4e-6 + (1 << 20) / 11e9)
    res = _write(tmp_path / "res", recs)
    out = tmp_path / "cal.json"
    r = _cli("fit", res, "--out", out, "--bootstrap", 50, "--nccl-log", NCCL_LOG.parent)
    assert r.returncode == 0, r.stderr
    assert "NCCL's own model" in r.stdout and "latency 204.4 us = 14.60 us per step" in r.stdout
    assert json.loads(out.read_text())["nccl_model"]["nranks"] == 8
    r = _cli("fit", res, "--nccl-log", tmp_path / "nothing.log")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "no NCCL log there" in r.stderr


def test_the_latency_floor_is_the_fastest_sampled_call_less_its_bytes_worked():
    def sampled(rec, op, size, by_rank):
        row = next(r for r in rec["rows"] if r["op"] == op and r["size"] == size)
        row["stability"] = {"times_us_by_rank": by_rank}

    recs = _recs(scales=(2, 4), blocks=2)
    for _, r in recs:
        if r["world"]["world_size"] == 2:
            # a call's time is its slowest rank's (9000, 8900, 9500 us); the fastest of them is 8900
            sampled(r, "all_gather", SIZES[0], {"0": [9000.0, 8700.0, 9500.0], "1": [8800.0, 8900.0, 9100.0]})
            sampled(r, "all_gather", SIZES[1], {"0": [100.0], "1": [100.0]})     # a larger size: not the floor's
            sampled(r, "all_reduce", SIZES[0], {"0": [30000.0], "1": [30000.0]})
    cal = pj.fit(recs, boot=50)
    ag = cal["ops"]["all_gather"]
    beta = ag["beta_s_per_byte"]
    f = ag["latency_floor"]["2"]
    # 64 KiB at 2 ranks: L = 1 step, G = 1/2: (8.9 ms - 32768 B x beta) / 1
    assert f["size"] == SIZES[0] and f["calls"] == 6 and f["fastest_call_s"] == pytest.approx(8.9e-3)
    assert f["alpha_floor_s"] == pytest.approx(8.9e-3 - 32768 * beta)
    ar = cal["ops"]["all_reduce"]["latency_floor"]["2"]      # L = 2 steps, G = 1
    assert ar["alpha_floor_s"] == pytest.approx((30e-3 - 65536 * cal["ops"]["all_reduce"]["beta_s_per_byte"]) / 2)
    # the fabric's latency: the least floor of any op at the smallest scale
    assert cal["latency_floor"] == {"p": 2, "op": "all_gather", "alpha_floor_s": f["alpha_floor_s"]}
    assert "latency: " in pj.fit_lines(cal)[1] and cal["ops"]["all_gather"]["latency_floor"].keys() == {"2"}
    assert pj.fit(_recs(blocks=2), boot=50)["latency_floor"] is None                     # nothing sampled


def test_check_leaves_out_the_fitted_records_and_says_why():
    recs = _recs(blocks=3)
    cal = pj.fit(recs, boot=50)
    assert cal["record_ids"] == sorted(r["record_id"] for _, r in recs)
    with pytest.raises(UsageError, match="every record given \\(6\\) is one the calibration was fitted on"):
        pj.check_against(cal, recs)
    new = (Path("/r/8.json"), _rec(8, 0, noise=_wobble(0, 8)))
    other = (Path("/r/t.json"), {"workload": "pretrain", "status": "ok"})
    failed = (Path("/r/f.json"), _rec(8, 1) | {"status": "failed"})
    rows = pj.check_against(cal, [*recs[:2], new, other, failed])
    assert {r["p"] for r in rows} == {8}                            # the fitted 2-rank cells are not checked
    assert pj.left_out(cal, [*recs[:2], new, other, failed]) == [
        (recs[0][0], "the calibration was fitted on it"), (recs[1][0], "the calibration was fitted on it"),
        (Path("/r/t.json"), "a pretrain record, not collectives"), (Path("/r/f.json"), "status failed")]


def test_a_fit_from_few_blocks_says_how_few():
    few = pj.fit_lines(pj.fit(_recs(blocks=2), boot=50))
    assert any("note: few blocks (2 at 2 ranks, 2 at 4 ranks): the noise is known to 8 degrees of freedom" in x
               for x in few), few
    many = pj.fit_lines(pj.fit(_recs(blocks=4), boot=50))
    assert not any("few blocks" in x for x in many) and any("between blocks (24 degrees of freedom)" in x for x in many)
    one = pj.fit_lines(pj.fit([(Path(f"/r/{p}.json"), _rec(p, 0)) for p in (2, 4)], boot=50))
    assert any("noise: from the fit's residuals" in x and "1 at 2 ranks" in x for x in one), one


@pytest.mark.parametrize("edit,field", [
    (lambda c: c["ops"]["all_reduce"].update(alpha_s="fast"), "ops.all_reduce.alpha_s is 'fast', not a finite number"),
    (lambda c: c["ops"]["all_reduce"].update(kappa_s=-1.0), "ops.all_reduce.kappa_s is -1.0, outside [0.0, inf]"),
    (lambda c: c.pop("fabric"), "fabric is missing"),
    (lambda c: c.update(pi_level=90), "pi_level is 90, outside (0, 1]"),
    (lambda c: c["ops"]["all_gather"].pop("draws"), "ops.all_gather.draws is missing"),
    (lambda c: c["ops"]["all_gather"].update(scales=[2, "4"]), "ops.all_gather.scales is [2, '4'], holds '4'"),
    (lambda c: c["code"].pop("commit"), "code.commit is missing"),
    (lambda c: c["ops"].update(broadcast={}), "ops.broadcast is not a collective the model knows"),
])
def test_every_calibration_field_is_checked_on_load(tmp_path, edit, field):
    cal = pj.fit(_recs(blocks=2), boot=50)
    assert pj.problem(cal) is None
    edit(cal)
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    with pytest.raises(UsageError, match="field " + field.replace("[", "\\[").replace("(", "\\(").replace(")", "\\)")
                       .replace("]", "\\]").replace(".", "\\.")):
        pj.load(tmp_path / "cal.json")


@pytest.mark.parametrize("value,said", [(float("nan"), "is nan"), (-1.0, "is -1.0"), (0, "is 0:"), ("x", "is 'x'"),
                                        (float("inf"), "is inf")])
def test_a_time_a_fit_cannot_use_is_refused_naming_the_record(value, said):
    bad = _rec(4, 9)
    bad["rows"][1]["in_place"]["time_us"] = value
    with pytest.raises(UsageError, match=f"/r/bad.json: rows\\[1\\] \\(all_reduce 262144 B\\) in_place.time_us {said}"):
        pj.fit(_recs() + [(Path("/r/bad.json"), bad)], boot=50)


def test_two_backends_or_two_ncclS_under_one_fabric_are_refused():
    gloo = [(p, r | {"fabric": {"name": "emu-100m", "backend": "gloo"}}) for p, r in _recs(scales=(2,))]
    with pytest.raises(UsageError, match="ran on 2 backends \\(gloo, unnamed\\)"):
        pj.fit(gloo + _recs(scales=(4,)))
    v = [(p, r | {"fingerprint": r["fingerprint"] | {"nccl": "2.30.7" if r["world"]["world_size"] == 2 else "2.23.4"}})
         for p, r in _recs()]
    with pytest.raises(UsageError, match="ran NCCL 2.23.4, 2.30.7"):
        pj.fit(v)


def test_the_calibration_names_its_one_backend():
    recs = [(p, r | {"fabric": {"name": "emu-100m", "backend": "gloo"}}) for p, r in _recs()]
    cal = pj.fit(recs, boot=50)
    assert cal["backend"] == "gloo" and cal["nccl_version"] is None


def test_model_project_at_512_ranks_prints_no_interval_below_the_floor_or_above_the_line(tmp_path):
    """What `model project` prints at 512 ranks (model-only, 128x the 4 measured), read back from
    its lines: every interval's low end at or above the schedule's floor (each ring step at the
    measured latency floor, the bytes at the payload ceiling), so no busbw bound above the line."""
    recs = _recs(blocks=3)
    for _, r in recs:
        if r["world"]["world_size"] == 2:     # 30 calls of the smallest size timed one by one, fastest 0.5 ms
            for row in r["rows"]:
                if row["size"] == SIZES[0]:
                    row["stability"] = {"times_us_by_rank": {"0": [500.0 + 10 * k for k in range(30)], "1": [500.0] * 30}}
    cal = tmp_path / "cal.json"
    assert _cli("fit", _write(tmp_path / "res", recs), "--out", cal, "--bootstrap", 100).returncode == 0
    r = _cli("project", cal, "--ranks", "512", "--sizes", "4K,64K,1M,16M,256M")
    assert r.returncode == 0, r.stderr
    c = json.loads(cal.read_text())
    lines = r.stdout.splitlines()
    assert len(lines) == 2 * 5 and all("at 512 ranks" in x and "model-only" in x for x in lines)
    for x in lines:
        op = x.split()[1]
        lo_ms = float(x.split("[")[1].split(",")[0])
        bus_hi = float(x.split("busbw ")[1].split("[")[1].split("]")[0].split(",")[1])
        s = {"4 KiB": 4 << 10, "64 KiB": 64 << 10, "1 MiB": 1 << 20, "16 MiB": 16 << 20, "256 MiB": 256 << 20}[" ".join(x.split()[2:4])]
        floor = pj.schedule_floor(c, op, 512, s)
        # worked for the all_reduce's floor: 2 x 511 steps x its alpha floor + 2 x 511/512 x S / 11.955 MB/s
        if op == "all_reduce":
            a = c["ops"][op]["latency_floor"]["2"]["alpha_floor_s"]
            assert floor == pytest.approx(2 * 511 * a + 2 * 511 / 512 * s / 11.955e6, rel=1e-9)
        assert lo_ms >= floor * 1e3 - 5e-4, x                    # printed to 3 decimals of a ms
        assert bus_hi <= 0.011955 * (1 + 1e-3), x                 # printed to 4 figures
