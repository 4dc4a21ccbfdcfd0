"""End to end: two real CPU training sweeps under two fabric labels that both run Gloo over
loopback (an A/A comparison), one of them tracked by W&B offline, then `report`.

The second fabric is the loopback profile renamed on the command line
(`fabric.name=loopback-b`): an A/A pair is a test device, not a fabric users should find
in conf/fabric/. Trials are a `trial=0,1` sweep key (ignored by the guard, like run_id).
Both launches run at once to halve the wall time; an A/A comparison does not care that
they share the 2 cores.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from helpers import REPO, child_env

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SWEEP = ["-m", "train.micro_batch_size=1,2,4", "trial=0,1", "train.steps=6", "train.warmup_steps=2", "train.seq_length=32"]


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


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    wandb_dir = root / "wandb"
    wandb_dir.mkdir()
    procs = {}
    for fabric, extra, env in (
        ("loopback", [], child_env()),
        ("loopback-b", ["fabric.name=loopback-b", "logger=wandb", "+fabric.env.MY_SECRET_TOKEN=hunter2"],
         child_env(WANDB_MODE="offline", WANDB_DIR=str(wandb_dir))),
    ):
        env.pop("WANDB_API_KEY", None)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(REPO / "launch" / "train.py"), *SWEEP, *extra, f"output_root={root / 'results'}", f"run_id={fabric}"]
        procs[fabric] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outs = {}
    for fabric, p in procs.items():
        outs[fabric], _ = p.communicate(timeout=500)
        assert p.returncode == 0, outs[fabric][-3000:]
    return root, wandb_dir, outs


@pytest.mark.slow
def test_report_end_to_end(sweeps, tmp_path):
    root, _, _ = sweeps
    out = tmp_path / "report"
    # Other engineers commit to this tree while the two sweeps run: the git commit of
    # fabricbench may differ between them, so it is declared as allowed to differ.
    cmd = [sys.executable, "-m", "workloads.core.cli", "report", str(root / "results"), "--baseline", "loopback",
           "--out", str(out), "--allow", "fingerprint.git"]
    res = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    # one verdict per micro batch, each with its interval
    verdicts = [line for line in res.stdout.splitlines() if "[samples_per_sec]" in line]
    assert len(verdicts) == 3, res.stdout
    for line in verdicts:
        # one of the three words, never a bare "not significant"; 2 vs 2 cannot bound the ratio
        assert any(w in line for w in (" is faster than ", "]: equivalent within", "]: inconclusive: ")), line
        assert "%" in line and "[" in line and "not significant" not in line
        assert "n=2 vs 2" in line
    md, html = out / "report.md", out / "report.html"
    assert md.is_file() and html.is_file()
    pngs = sorted((out / "plots").glob("*.png"))
    assert {p.stem for p in pngs} == {"training_0"}  # one comparable group: sps, TFLOPS/GPU and the ratio vs micro batch
    for p in pngs:
        assert p.read_bytes()[:8] == PNG_SIGNATURE
        h, w = mpimg.imread(p).shape[:2]
        assert h > 100 and w > 100
        assert (p.with_suffix(".svg")).read_text().lstrip().startswith("<?xml")
        assert f"plots/{p.name}" in md.read_text()
    text = html.read_text()
    assert text.count("data:image/png;base64,") == len(pngs) and "<img" in text and 'src="plots/' not in text
    assert "samples/s: inconclusive, " in md.read_text() and "not significant" not in md.read_text()
    assert "loopback-b" in md.read_text() and "## Runs" in md.read_text()
    assert md.read_text().index("## Headline") < md.read_text().index("## Verdicts") < md.read_text().index("## Charts")


@pytest.mark.slow
def test_wandb_offline_end_to_end(sweeps):
    _, wandb_dir, outs = sweeps
    runs = sorted(wandb_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 6, outs["loopback-b"][-2000:]  # 3 batch sizes x 2 trials, one W&B run each
    for run in runs:
        (log,) = run.glob("run-*.wandb")
        recs = read_wandb_log(log)
        kinds = [r.WhichOneof("record_type") for r in recs]
        head = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
        assert head.job_type == "pretrain" and head.run_group == "pretrain-neox-tiny-ddp-ws2"
        assert "fabric:loopback-b" in head.tags and head.display_name.startswith("loopback-b-neox-tiny-ddp-mb")
        steps = [{(i.key or "/".join(i.nested_key)) for i in r.history.item} for r in recs if r.WhichOneof("record_type") == "history"]
        assert len(steps) == 6 and all({"step_time(s)", "samples_per_sec", "tflops_per_gpu", "loss"} <= s for s in steps)
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
