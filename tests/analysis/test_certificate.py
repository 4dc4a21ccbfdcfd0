"""The fabric certificate (analysis/certificate.py, `fabricbench certify`): the KPI formulas on
worked values, the verdict rule (an interval straddling the reference is "cannot tell"), the
interval's coverage and the false-pass rate by simulation through the certificate's own code, and
the command on real records: a study here (tests/fixtures/certificate/emu-cert, written by
`fabricbench study conf/study/emu-cert.yaml` on 2026-12-02: the emulated leaf-spine healthy, with
spine s1's uplinks at 25 Mbit/s, and the healthy fabric again as the A/A control, 3 blocks), whose
A/A pair must call nothing different; bad input is one line; the HTML renders in Chromium."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from analysis import certificate as cert
from analysis.load import load_table
from helpers import FIXTURES, REPO, browser

STUDY = FIXTURES / "certificate" / "emu-cert"


def test_jain_and_mmr_worked_values():
    # docs/metrics.md: 300 and 100 bytes give J = 400² / (2 × (300² + 100²)) = 0.8; MMR = 300 / 200 = 1.5
    assert cert.jain([300, 100]) == pytest.approx(0.8) and cert.mmr([300, 100]) == pytest.approx(1.5)
    assert cert.jain([5, 5, 5]) == 1.0 and cert.mmr([5, 5, 5]) == 1.0
    assert cert.jain([0, 0]) is None and cert.mmr([]) is None


def _train_record(rate_gbit=1.0):
    node = {"rails": ["net:emu0"], "per_rail": {"net:emu0": {"line_rate(Gbit/s)": rate_gbit, "tx_bytes": 1, "rx_bytes": 1}}}
    call = ["all_reduce", "float32", 1_000_000, 4, 0.0, 0.1]
    return {"samples": {"warmup_steps": 1, "step_time_s": [9.0, 0.2, 0.3], "comm_time_s": [9.0, 0.15, 0.25],
                        "comm_calls": [[call], [call]]}, "nic": {"nodes": [node, node]}}


def test_jct_ratio_worked_value():
    # bus bytes per step = 4e6 B x 2(4-1)/4 = 6e6 B; at 1 Gbit/s (1.25e8 B/s) 0.048 s. Non-fabric
    # 0.05 s in each step, so roofline 0.098 s a step; measured 0.5 s over the two: 0.5 / 0.196
    ratio, other = cert.jct_ratio(_train_record())
    assert ratio == pytest.approx(0.5 / 0.196) and other == pytest.approx(0.05)
    rec = _train_record()
    rec["samples"]["comm_calls"][0][0] = ["all_to_all", "float32", 10, 4, 0, 1]
    assert "prices all_reduce and broadcast" in cert.jct_ratio(rec)
    rec = _train_record()
    rec["nic"]["nodes"][1]["per_rail"]["net:emu0"]["line_rate(Gbit/s)"] = None
    assert "no line rate" in cert.jct_ratio(rec)


def test_tail_latency_is_the_slowest_rank_per_call():
    st = {"times_us_by_rank": {"0": [1.0, 5.0, 2.0], "1": [3.0, 1.0, 2.5]}}
    assert list(cert.call_times_us(st)) == [3.0, 5.0, 2.5]


def test_verdict_never_passes_a_straddling_interval():
    ge, le = cert.Ref(">=", 90, "draft"), cert.Ref("<=", 1.05, "draft")
    assert ge.judge(91, 95) == "pass" and ge.judge(80, 89.9) == "fail" and ge.judge(85, 95) == "cannot tell"
    assert le.judge(1.0, 1.04) == "pass" and le.judge(1.06, 1.2) == "fail" and le.judge(1.0, 1.1) == "cannot tell"
    assert ge.judge(math.nan, math.nan) == "cannot tell"


def test_interval_covers_and_a_fabric_at_the_reference_rarely_passes():
    """4 trials of N(90, 3): the 95% interval holds 90 in about 95% of studies, and a fabric whose
    true busbw is exactly the 90% reference passes in at most 2.5% (the interval's lower tail)."""
    rng = np.random.default_rng(60_071)
    ref, hits, passes, sims = cert.Ref(">=", 90.0, "draft"), 0, 0, 4000
    for _ in range(sims):
        m, lo, hi = cert.interval(rng.normal(90.0, 3.0, 4), 0.95, "busbw")
        hits += lo <= 90.0 <= hi
        passes += ref.judge(lo, hi) == "pass"
    se = math.sqrt(0.05 * 0.95 / sims)
    assert abs(hits / sims - 0.95) < 4 * se
    assert passes / sims < 0.025 + 4 * math.sqrt(0.025 * 0.975 / sims)
    # and one 10% above it passes most of the time: the rule is not "never pass"
    rng = np.random.default_rng(60_072)
    got = [ref.judge(*cert.interval(rng.normal(99.0, 3.0, 4), 0.95, "busbw")[1:]) for _ in range(400)]
    assert got.count("pass") / len(got) > 0.6


def test_an_aa_pair_is_called_different_at_most_at_the_family_rate():
    """Simulated A/A studies through side_by_side: both labels draw from one fabric; over many
    studies the share that calls any KPI row different stays near alpha (Holm over the rows)."""
    rng = np.random.default_rng(60_073)

    def c(arm, vals):
        rows = [cert.Row(k, k, "x", "", "", "", values=list(v), blocks=list(range(len(v)))) for k, v in vals.items()]
        return cert.Certificate(arm, "f", rows, 6, [], "")

    loud, sims = 0, 300
    for _ in range(sims):
        block = rng.normal(0, 0.05, 6)  # a block effect both labels share, as in an interleaved study
        a = {k: np.exp(block + rng.normal(0, 0.03, 6)) * 90 for k in ("busbw", "p99", "jct-ratio")}
        b = {k: np.exp(block + rng.normal(0, 0.03, 6)) * 90 for k in ("busbw", "p99", "jct-ratio")}
        loud += any(cert.called(d) for d in cert.side_by_side(c("A", a), c("B", b)))
    assert loud / sims < 0.05 + 4 * math.sqrt(0.05 * 0.95 / sims)
    # and a 30% shift is called
    a = {"busbw": np.full(6, 90.0) * np.exp(rng.normal(0, 0.03, 6))}
    b = {"busbw": np.full(6, 63.0) * np.exp(rng.normal(0, 0.03, 6))}
    assert cert.called(cert.side_by_side(c("A", a), c("B", b))[0])


@pytest.fixture(scope="module")
def certified(tmp_path_factory):
    out = tmp_path_factory.mktemp("cert")
    p = _certify(str(STUDY), "--out", str(out))
    assert p.returncode == 0, p.stderr
    return out, p.stdout


def _certify(*args):
    return subprocess.run([sys.executable, "-m", "workloads.commands.cli", "certify", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_every_kpi_with_interval_reference_and_verdict(certified):
    out, stdout = certified
    doc = json.loads((out / "certificate-healthy.json").read_text())
    rows = {(r["kpi"], r["point"]): r for r in doc["rows"]}
    for key in ("jct-ratio", "non-fabric", "mmr-uplinks", "jain-uplinks", "mmr-rails", "jain-rails", "p99"):
        got = [r for (k, _), r in rows.items() if k == key]
        assert got and all(len(r["values"]) == 3 and r["lo"] <= r["estimate"] <= r["hi"] for r in got), key
    busbw = rows[("busbw", "all_reduce 1 MiB")]
    assert busbw["reference"].startswith("≥ 90%") and busbw["verdict"] in ("pass", "fail", "cannot tell")
    # each verdict follows from its interval and the reference
    for r in doc["rows"]:
        if r["kpi"] in ("busbw", "jct-ratio") and r["lo"] is not None:
            ref = cert.KPIS[r["kpi"]].reference
            assert r["verdict"] == ref.judge(r["lo"], r["hi"])
    # the values are the records' own: busbw % from the rows, spines' shares from `paths`
    t = load_table([str(STUDY)]).ok()
    mine = [x for x in t if x.arm == "healthy" and x.workload == "collectives"]
    big = [row for x in mine for row in x.rows if row["size"] == 1 << 20]
    assert sorted(busbw["values"]) == pytest.approx(sorted(row["in_place"]["pct_line_rate"] for row in big))
    assert rows[("p99.9", "—")]["verdict"] == "not in these records"
    unmeasured = [r for r in doc["rows"] if not r["kpi"]]
    assert {r["name"] for r in unmeasured} == {"PFC pause duration / count", "ECN marking ratio", "CNPs (DCQCN)",
                                               "Congestion-control convergence"}
    assert all(r["verdict"] == "not measurable here" for r in unmeasured)
    assert "np_ecn_marked_roce_packets" in (out / "certificate-healthy.md").read_text()
    assert "6 of 6 runs: ok (Socket)" in (out / "certificate-healthy.md").read_text()


def test_aa_calls_nothing_different(certified):
    out, stdout = certified
    aa = json.loads((out / "side-by-side-healthy-aa-vs-healthy.json").read_text())
    assert aa["differences"] and not any(d["different"] for d in aa["differences"])
    assert "healthy~aa vs healthy: 0 of" in stdout
    ab = (out / "side-by-side-degraded-vs-healthy.md").read_text()
    assert "| healthy | verdict | degraded | verdict |" in ab


@pytest.mark.parametrize("args, says", [
    (["--kpi", "failover"], "--kpi failover: the records of healthy cannot support it: no run with a fault schedule"),
    (["--kpi", "nope"], "--kpi nope: not a KPI"),
    (["--fabric", "roce"], "--fabric roce: no ok record of it here; the fabrics (arms) here: degraded, healthy, healthy~aa"),
    (["--reference", "busbw=>9"], "--reference 'busbw=>9': write KEY>=VALUE"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, says):
    out = tmp_path / "c"
    p = _certify(str(STUDY), "--out", str(out), *args)
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not out.exists()


def test_a_users_reference_replaces_the_drafts(tmp_path):
    p = _certify(str(STUDY), "--out", str(tmp_path), "--fabric", "healthy", "--reference", "mmr-uplinks<=3")
    assert p.returncode == 0, p.stderr
    row = next(r for r in json.loads((tmp_path / "certificate-healthy.json").read_text())["rows"] if r["kpi"] == "mmr-uplinks")
    assert row["reference"] == "≤ 3 (user)" and row["verdict"] in ("pass", "cannot tell", "fail")
    assert not list(tmp_path.glob("side-by-side-*"))


@pytest.mark.requires("chromium")
def test_certificate_html_in_chromium(certified, tmp_path):
    out, _ = certified
    for page in ("certificate-degraded.html", "side-by-side-degraded-vs-healthy.html"):
        seen = browser.check(out / page)
        assert seen["overflowing_cells"] == [] and seen["wide_tables"] == [], seen
    png = browser.screenshot(out / "certificate-degraded.html", tmp_path / "shot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
