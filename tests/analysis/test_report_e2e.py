"""The report a user opens, end to end: `fabricbench report` on a real results folder with every
workload and a refused pair (tests/helpers/report_demo.py: real 2-rank Gloo training and
collectives under two fabric labels that both run Gloo over loopback, one of them tracked by
W&B offline; inference against the scripted server), plus an nccl-tests -J fixture, rendered by
headless Chromium. One build of the folder serves every test here.

Checks what a reader sees: the headline first, one verdict per comparable point with its
interval, every image loaded, no text overflowing its table, the refusals collapsed at the end,
nccl-tests' curve on the busbw chart; and what W&B received, with the secret redacted. With
FABRICBENCH_SCREENSHOT=<file.png> the first screen is saved there, palette-reduced to stay
small. (docs/analysis.md's picture is of a real A/B study, not this A/A demo: its Report item.)
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from helpers import FIXTURES, REPO, browser, child_env

FIXTURE = FIXTURES / "nccl_tests" / "all_reduce_perf-J.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from helpers.report_demo import build

    root = tmp_path_factory.mktemp("demo")
    results = build(root, wandb_dir=root / "wandb")
    out = root / "report"
    cmd = [sys.executable, "-m", "workloads.commands.cli", "report", str(results), "--baseline", "loopback", "--out", str(out),
           "--slo-ttft-ms", "12", "--allow", "fingerprint.git", "--external", str(FIXTURE)]  # the tree's commit moves while tests run
    res = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return results, out, res.stdout, root / "wandb"


@pytest.mark.slow
def test_mixed_folder_report_reads_top_down(demo):
    results, out, _, _ = demo
    md = (out / "report.md").read_text()
    heads = md[md.index("## Headline"):md.index("## Verdicts")]
    for wl in ("Pre-training", "Collectives", "Inference"):
        assert f"**{wl} — " in heads  # one bold claim per workload, before anything else
    assert "% faster than " in heads and "Holm" in heads and "A/A control" in heads
    assert md.index("## Headline") < md.index("## Verdicts") < md.index("## Charts")
    assert "## Runs" in md and "not significant" not in md
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
def test_one_verdict_per_micro_batch_in_words_with_its_interval(demo):
    _, out, stdout, _ = demo
    # mb=1 and mb=2 at sequence length 32 ran under both labels: one verdict each
    verdicts = [line for line in stdout.splitlines() if "[samples_per_sec]" in line]
    assert len(verdicts) == 2, stdout
    for line in verdicts:
        # one of the three words, never a bare "not significant"; 2 vs 2 cannot bound the ratio
        assert any(w in line for w in (" is faster than ", "]: equivalent within", "]: inconclusive: ")), line
        assert "%" in line and "[" in line and "not significant" not in line and "n=2 vs 2" in line
    md, html = out / "report.md", out / "report.html"
    pngs = sorted((out / "plots").glob("*.png"))
    assert pngs
    for p in pngs:
        assert p.read_bytes()[:8] == PNG_SIGNATURE
        h, w = mpimg.imread(p).shape[:2]
        assert h > 100 and w > 100
        assert (p.with_suffix(".svg")).read_text().lstrip().startswith("<?xml")
        assert f"plots/{p.name}" in md.read_text()
    text = html.read_text()
    assert text.count("data:image/png;base64,") == len(pngs) and "<img" in text and 'src="plots/' not in text


def read_wandb_log(path: Path) -> list:
    """The records of a .wandb transaction log (LevelDB log framing: 32 KiB blocks of
    [crc32 u32][length u16][type u8] chunks, FULL=1 FIRST=2 MIDDLE=3 LAST=4, after a
    7-byte ':W&B' header), parsed with wandb's own protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, ln, typ = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + ln], pos + 7 + ln
        if typ == 1:
            out.append(chunk)
        elif typ == 2:
            buf = chunk
        elif typ == 3:
            buf += chunk
        elif typ == 4:
            out.append(buf + chunk)
    recs = []
    for d in out:
        r = pb.Record()
        r.ParseFromString(d)
        recs.append(r)
    return recs


@pytest.mark.slow
def test_wandb_offline_end_to_end(demo):
    """loopback-b's training sweep ran with logger=wandb (offline) and a secret in its fabric env."""
    _, _, _, wandb_dir = demo
    runs = sorted(wandb_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 4  # 2 batch sizes x 2 trials, one W&B run each
    for run in runs:
        (log,) = run.glob("run-*.wandb")
        recs = read_wandb_log(log)
        kinds = [r.WhichOneof("record_type") for r in recs]
        head = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
        assert head.job_type == "pretrain" and head.run_group == "pretrain-neox-tiny-ddp-ws2"
        assert "fabric:loopback-b" in head.tags and head.display_name.startswith("loopback-b-neox-tiny-ddp-mb")
        steps = [{(i.key or "/".join(i.nested_key)) for i in r.history.item} for r in recs if r.WhichOneof("record_type") == "history"]
        assert len(steps) == 5 and all({"step_time(s)", "samples_per_sec", "tflops_per_gpu", "loss"} <= s for s in steps)
        summary = {(i.key or "/".join(i.nested_key)) for r in recs if r.WhichOneof("record_type") == "summary" for i in r.summary.update}
        assert {"samples_per_sec", "iteration_time(s)", "status"} <= summary
        config = {(i.key or "/".join(i.nested_key)): i.value_json for r in recs if r.WhichOneof("record_type") == "config"
                  for i in r.config.update}
        assert config["fabric/name"] == '"loopback-b"' and "fingerprint/torch" in config
        assert config["config/fabric/env/MY_SECRET_TOKEN"] == '"<redacted>"'
        assert "exit" in kinds
    # the secret never reached W&B's files, though it was on the command line
    for f in wandb_dir.rglob("*"):
        if f.is_file():
            assert b"hunter2" not in f.read_bytes(), f


@pytest.mark.slow
@pytest.mark.requires("chromium")
def test_report_in_chromium_images_load_and_tables_fit(demo, tmp_path):
    _, out, _, _ = demo
    seen = browser.check(out / "report.html")
    assert len(seen["images"]) == len(list((out / "plots").glob("*.png"))) >= 5
    assert all(i["complete"] and i["width"] > 100 for i in seen["images"]), seen["images"]
    assert seen["overflowing_cells"] == [] and seen["wide_tables"] == [], seen
    png = browser.screenshot(out / "report.html", tmp_path / "shot.png")
    assert png.read_bytes()[:8] == PNG_SIGNATURE
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


def test_a_demo_launch_past_the_budget_is_named_with_the_ones_before_it():
    """The shared fixture's build names the launch that ran long (and what ran before it, with
    times) instead of being cut off silently by pytest's timeout."""
    from helpers.report_demo import Steps

    quick = [sys.executable, "-c", "pass", "run_id=quick"]
    slow = [sys.executable, "-c", "import time; print('warming up', flush=True); time.sleep(60)", "run_id=slowpoke"]
    steps = Steps(budget_s=3)
    with pytest.raises(RuntimeError) as e:
        steps.run_pairs([(quick, child_env()), (slow, child_env())])
    msg = str(e.value)
    assert "ran past its 3 s: slowpoke still running after" in msg and "before it: quick " in msg, msg
    assert "warming up" in msg, msg
