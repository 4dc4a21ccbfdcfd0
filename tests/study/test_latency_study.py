"""Latency at equal bandwidth, as a study (root): conf/study/emu-latency.yaml's arms, 0.5 ms and 5.5 ms
one way on the same 1 Gbit/s link, run for real through the delay line, at the size CI affords
(blocks planned from its measured noise: a sequential study from 3 to at most 6 blocks; without the
4 MiB all_reduce cell, which explains nothing the 1 KiB one does not).

It must call TP=2 TPOT slower with an interval, and its added TPOT must agree within 20% with the
arithmetic printed beside it ((2 x layers all_reduces + the step plan's broadcast) per token x the
added time of one 1 KiB all_reduce, measured by the same study); it must call the training gap at micro-batch 1 larger
than at micro-batch 16; every record must carry the delay the line achieved. And an A/A study at
the same delay must not call a difference.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, child_env, need, records_in
from workloads.fabric.delaymeter import tolerance_us

STUDY = [sys.executable, "-m", "workloads.commands.cli", "study"]


# What CI changes in the shipped cells. Far's TP=2 run served 10 requests of 16 tokens at ~125 ms a
# token (39 s, against 20 s near); 5 of 8 tokens still give each request 7 decode steps, and the
# effect is 6x. Training is split by micro-batch: micro-batch 1, whose verdict must be called, gets
# 160 steps (its steps take 25-50 ms, so 30 of them measured under a second, and one stall of a host
# shared with other work decided a block: near faster by 152% [-21, +705] with a far run at half
# the others' rate; at 80 steps the full suite still saw 113% [-14, +429]: a stall of a second or
# two is diluted by the window's length); micro-batch 16, which only has to lose less, 12 (140-190 ms each).
CI_SIZE = {"load.num_requests": "load.num_requests=4", "load.warmup_requests": "load.warmup_requests=1",
           "load.dataset.output_len": "load.dataset.output_len=8"}
TRAIN = [{"name": "train-mb1", "entry": "pretrain", "overrides": ["train.micro_batch_size=1", "train.steps=160",
                                                                "train.warmup_steps=2"]},
         {"name": "train-mb16", "entry": "pretrain", "overrides": ["train.micro_batch_size=16", "train.steps=12",
                                                                 "train.warmup_steps=2"]}]


def _spec(tmp: Path, name: str, edit) -> Path:
    spec = yaml.safe_load((REPO / "conf" / "study" / "emu-latency.yaml").read_text())
    spec["name"] = name
    spec["blocks"] = 3       # the A/A's fixed count; the A/B's fixture plans its own (SEQUENTIAL)
    spec["detect"] = "60%"   # 3 blocks and 4 primaries can call 52% at the default CV; the effects are 2-10x
    spec["workloads"] = TRAIN + [w for w in spec["workloads"] if w["name"] not in ("allreduce-4m", "train")]
    for w in spec["workloads"]:
        w["overrides"] = [CI_SIZE.get(o.split("=")[0], o) for o in w["overrides"]]
    edit(spec)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _run(spec: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([*STUDY, str(spec), "--output-root", str(out), *args], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=2400)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    return r


# The A/B's verdicts need power, so its blocks come from the noise it measures, not a fixed count: a
# sequential study looking after 3, 4 and 6 blocks (alpha spent in proportion), each verdict settled
# by a difference, equivalence, or a 60% difference ruled out (micro-batch 16 only has to lose
# less). On a quiet machine the first look decides all four; a loaded one adds blocks instead of
# failing "inconclusive ... could detect >= 385%" at a fixed 3.
SEQUENTIAL = ("--until-decided", "--max-blocks", "6", "--stop-on", "difference,equivalence,futility")


@pytest.fixture(scope="module")
def latency(tmp_path_factory):
    need("root")
    tmp = tmp_path_factory.mktemp("emu-latency")
    out = tmp / "results"
    return out / "lat", _run(_spec(tmp, "lat", lambda s: s.pop("blocks")), out, *SEQUENTIAL)


def _blocks(folder: Path) -> int:
    """The blocks the sequential study ran."""
    return 1 + max(r["study"]["block"] for r in records_in(folder))


def _comparisons(folder: Path, baseline: str):
    from analysis.compare import compare_table
    from analysis.load import load_table

    return compare_table(load_table([folder]), baseline).comparisons


# whichever test runs first pays for the study's 24 runs: 172-181 s here beside other engineers' work (load 7-13),
# then the A/A's 6 runs 31-38 s, with each arm's topology kept, the emulators, load generators and the TP=2
# engine's processes forked warm (216-237 s and 32-41 s with the engine exec'd; 386 s and 64 s with nothing kept,
# at load 10-13: docs/measurements.md#latency-at-equal-bandwidth)
pytestmark = [pytest.mark.timeout(2400), pytest.mark.slow]


@pytest.mark.timing  # verdicts on measured times
def test_tp_inference_is_called_slower_by_what_the_arithmetic_says(latency):
    folder, r = latency
    tpot = [c for p, c in _comparisons(folder, "near") if c.primary and c.metric == "median_tpot_ms"]
    assert len(tpot) == 1, r.stdout[-3000:]
    c = tpot[0]
    # far's TPOT higher, worded as a latency: "near's median_tpot_ms is x% lower than far's [...]"
    assert c.significant and c.lo > 1 and "lower than far's" in c.verdict and "[" in c.verdict, c.verdict
    line = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith("tp2 ") and "arithmetic" in ln), None)
    assert line is not None and "5 collectives per token (2 x 2 layers' all_reduces + the step plan's broadcast" \
        in line, r.stdout[-3000:]
    ratio = float(re.search(r"measured/arithmetic ([0-9.]+)", line).group(1))
    assert 0.8 <= ratio <= 1.2, line
    assert re.search(r"latency arithmetic, far vs near: \+(4\.9|5\.0)\d\d ms one way", r.stdout), r.stdout[-3000:]


@pytest.mark.timing
def test_the_training_gap_is_widest_at_the_smallest_batch(latency):
    folder, r = latency
    train = {p.runs[0].coords.get("micro_batch"): c for p, c in _comparisons(folder, "near")
             if c.primary and c.metric == "samples_per_sec"}
    assert set(train) == {1, 16}, (list(train), r.stdout[-3000:])
    mb1, mb8 = train[1], train[16]
    # far is slower, and by more at micro-batch 1: the same added time on a shorter step
    assert mb1.significant and mb1.hi < 1 and "near is" in mb1.verdict and "faster than far" in mb1.verdict \
        and "[" in mb1.verdict, mb1.verdict
    assert mb1.ratio < mb8.ratio, (mb1.verdict, mb8.verdict)
    assert "[" in mb8.verdict or "could detect" in mb8.verdict, mb8.verdict
    heads = [ln for ln in (folder / "compare.txt").read_text().splitlines() if ln.startswith("headline: Pre-training")]
    assert len(heads) == 2, heads


@pytest.mark.timing
def test_every_record_carries_the_delay_it_ran_at(latency):
    folder, _ = latency
    recs = [r for r in records_in(folder) if r["status"] == "ok"]
    assert len(recs) >= 24
    for rec in recs:
        delay = rec["fabric"]["delay"]
        asked = {"near": 500.0, "far": 5500.0}[rec["study"]["arm"]]
        assert delay["problem"] is None and delay["links"]["n0-n1"]["asked_us"] == asked
        for d in delay["links"]["n0-n1"]["directions"].values():
            if d["frames"] >= 50:
                assert abs(d["p50_us"] - asked) <= tolerance_us(asked), (rec["study"], d)


@pytest.mark.timing
def test_an_aa_study_at_the_same_delay_calls_no_difference(tmp_path):
    """Two arms at the same 0.5 ms, the latency-bound all_reduce only (6 runs): no difference called.
    Judged at alpha 0.001, as the A/A pool of tests/analysis/test_aa.py is: at the study's 0.05 a
    correct pipeline would fail this test once in 20 runs; what it is here to catch, arms not run
    alike (a delay or a rate set on one only, a run order that favours one), moves a 1 KiB all_reduce
    by far more than its block-to-block noise and is called at either level. (Its one CI failure:
    near faster than near-again by 1.2% [0.7, 1.8], p = 0.011, when each arm kept one topology,
    one instance, for the whole study; each arm's is now built anew each block, workloads/study/fabrics.py.
    Its second, "near-again faster by 10.4% [7.8, 13.0] (95% CI; p = 0.003)": the study had judged at
    0.001, but compare re-judged its folder at 0.05; the records now carry the study's alpha.)"""
    def aa(spec):
        spec["alpha"] = 0.001
        spec["arms"] = [dict(spec["arms"][0]), {**spec["arms"][0], "label": "near-again", "baseline": False}]
        spec["workloads"] = [w for w in spec["workloads"] if w["name"] == "allreduce-1k"]
    r = _run(_spec(tmp_path, "aa", aa), tmp_path / "out")
    (c,) = [c for _, c in _comparisons(tmp_path / "out" / "aa", "near") if c.primary]
    assert not c.significant and ("equivalent" in c.verdict or "inconclusive" in c.verdict), c.verdict
    assert "latency arithmetic" not in r.stdout  # arms at one delay: nothing to explain


@pytest.mark.timing
def test_each_arm_ran_on_kept_topologies_of_its_own(latency):
    """The study builds each arm's namespaces and delay line once per block (workloads/study/fabrics.py),
    not once per run nor once per study; arms never share one, and none is left when the study ends."""
    from workloads.fabric.netns import leftovers

    folder, _ = latency
    seen: dict[str, set[str]] = {}
    for log in (folder / "logs").glob("*.log"):
        line = next(ln for ln in log.read_text().splitlines() if ln.startswith("emulate: "))
        assert "kept for the study's arm" in line, line
        arm = "far" if "-far-" in log.name else "near"
        seen.setdefault(arm, set()).add(re.search(r"\((fb-[^,]+)-0,", line).group(1))
    assert sum(1 for _ in (folder / "logs").glob("*.log")) >= 24
    assert all(len(tags) == _blocks(folder) for tags in seen.values()) and not seen["near"] & seen["far"], seen
    # each TP=2 run's engine and node agents were forked, not fresh interpreters (inference/adapters/forkstart.py)
    served = list(folder.glob("*/server/reference.log"))
    assert len(served) >= 6 and all("forked from the warm load generator" in p.read_text() for p in served), served
    assert not [n for n in leftovers() if any(n.startswith(t) for tags in seen.values() for t in tags)]
