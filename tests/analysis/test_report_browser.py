"""The report a user opens: `fabricbench report` on a real results folder with every workload
and a refused pair (tests/report_demo.py: real 2-rank Gloo runs, inference against the
scripted server), plus an nccl-tests -J fixture, rendered by headless Chromium.

Checks what a reader sees: the headline first, every image loaded, no text overflowing its
table, the refusals collapsed at the end, nccl-tests' curve on the busbw chart. With
FABRICBENCH_SCREENSHOT=<file.png> the first screen is saved there, palette-reduced to stay
small. (The README's picture is of a real A/B study, not this A/A demo: README, Report.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import FIXTURES, REPO, browser, child_env

FIXTURE = FIXTURES / "nccl_tests" / "all_reduce_perf-J.json"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from helpers.report_demo import build

    root = tmp_path_factory.mktemp("demo")
    results = build(root)
    out = root / "report"
    cmd = [sys.executable, "-m", "workloads.core.cli", "report", str(results), "--out", str(out), "--slo-ttft-ms", "12",
           "--allow", "fingerprint.git", "--external", str(FIXTURE)]  # the tree's commit moves while tests run
    res = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return results, out


@pytest.mark.slow
def test_mixed_folder_report_reads_top_down(demo):
    results, out = demo
    md = (out / "report.md").read_text()
    heads = md[md.index("## Headline"):md.index("## Verdicts")]
    for wl in ("Pre-training", "Collectives", "Inference"):
        assert f"**{wl} — " in heads  # one bold claim per workload, before anything else
    assert "% faster than " in heads and "Holm" in heads and "A/A control" in heads
    # the refused pair (mb=2 at sequence length 48 vs 64) is collapsed at the very end, relative paths
    tail = md[md.index("## Refused comparisons"):]
    assert "<details><summary>1 refused pair, in 1 group" in tail
    assert "1 pair differs in batch.seq_length, config.train.seq_length" in tail and str(results) not in tail
    assert "train-seq48/records/" in tail and "train-seq64/records/" in tail
    # the guard's groups are never pooled on a chart: three training groups, one per sequence length
    captions = [ln for ln in md.splitlines() if ln.startswith("*pretrain: throughput vs micro batch")]
    assert sorted(captions) == [f"*pretrain: throughput vs micro batch — config.train.seq_length={n}*" for n in (32, 48, 64)]
    # nccl-tests' numbers beside fabricbench's on the busbw chart (SVG text is searchable)
    svg = (out / "plots" / "busbw_all_reduce_0.svg").read_text()
    assert "nccl-tests: all_reduce_perf-J.json" in svg and "loopback-b" in svg
    assert "SLO 12 ms" in (out / "plots" / "inference_0.svg").read_text()
    assert len(list((out / "nccl-tests").glob("*-all_reduce.json"))) == 4  # one -J document per collectives record
    assert (out / "results.csv").read_text().count("\n") == 1 + len(list(results.rglob("records/*.json")))


@pytest.mark.slow
@pytest.mark.requires("chromium")
def test_report_in_chromium_images_load_and_tables_fit(demo, tmp_path):
    _, out = demo
    seen = browser.check(out / "report.html")
    assert len(seen["images"]) == len(list((out / "plots").glob("*.png"))) >= 5
    assert all(i["complete"] and i["width"] > 100 for i in seen["images"]), seen["images"]
    assert seen["overflowing_cells"] == [] and seen["wide_tables"] == [], seen
    png = browser.screenshot(out / "report.html", tmp_path / "shot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if dest := os.environ.get("FABRICBENCH_SCREENSHOT"):
        from PIL import Image

        # 128 colours by octree keep the arms' colours true and the file about 100 KB
        Image.open(png).convert("RGB").quantize(colors=128, method=Image.Quantize.FASTOCTREE).save(REPO / dest, optimize=True)
        assert (REPO / dest).stat().st_size < 300_000


@pytest.mark.requires("chromium")
def test_overflow_is_caught(tmp_path):
    """The check can fail: a cell holding one unbreakable 400-character word overflows it."""
    page = tmp_path / "wide.html"
    page.write_text("<!doctype html><html><body><table style='width:300px;table-layout:fixed'><tr><td>"
                    + "x" * 400 + "</td></tr></table><img alt='missing' src='nope.png'></body></html>")
    seen = browser.check(page)
    assert seen["overflowing_cells"] and seen["images"][0]["width"] == 0
