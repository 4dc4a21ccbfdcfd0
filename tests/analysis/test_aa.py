"""A real A/A study on CPU: the same fabric under two arm labels, interleaved ABBA, many tests.

2 ranks over Gloo on loopback run 6 collectives ops at 5 message sizes each, 6 blocks (trials
per arm), the arms alternating ABBA with the study's record fields set by the `study=`
override, exactly as `fabricbench study` sets them. Nothing differs but the label.

What one real study can show is the pipeline end to end: every verdict is "equivalent" or
"inconclusive" with an interval, the control reports an interval or says it cannot speak,
never "quiet", and a family-wise correction keeps it from calling a difference. The false-call
*rate* is a property of many independent studies, so it is pinned by simulation
(tests/analysis/test_power.py), not here: the 36 tests of one study are correlated (a block
whose second run was slower moves every op and size alike), and a binomial bound over them
needs an effective number of tests that 6 blocks cannot estimate (a 36 x 36 correlation
matrix from 6 blocks has rank <= 5; study-statistics.md, 1.6). The family-wise check runs at
alpha 0.01 so that this real-data test fails by chance at most 1% of the time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import REPO, child_env, records_in, run_entry

ALPHA = 0.05

BLOCKS = 6
OPS = "[all_reduce,all_gather,reduce_scatter,broadcast,alltoall,sendrecv]"
ARMS = ("loopback", "loopback~aa")


def run_study(out) -> None:
    pos = 0
    for block in range(BLOCKS):
        for arm in (ARMS if block % 2 == 0 else ARMS[::-1]):  # ABBA: the order flips every block
            cell = (f"{{name: aa, id: aa-cpu, arm: '{arm}', baseline: loopback, control: {str(arm != ARMS[0]).lower()}, "
                    f"block: {block}, position: {pos}, design: abba, seed: 0, blocks: {BLOCKS}}}")
            p = run_entry("collectives.py", "fabric=loopback", f"output_root={out}", f"run_id=aa-{pos}", f"trial={block}",
                          f"collectives.ops={OPS}", "collectives.minbytes=1K", "collectives.maxbytes=256K",
                          "collectives.stepfactor=4", "collectives.iters=5", "collectives.warmup_iters=1",
                          f"study={cell}", timeout=180)
            assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
            pos += 1


@pytest.mark.slow
@pytest.mark.timing
@pytest.mark.timeout(1800)  # 12 runs: ~3 minutes on an idle 2-core machine, 10+ when it is shared
def test_real_aa_study_speaks_in_intervals_and_calls_nothing(tmp_path):
    out = tmp_path / "results"
    run_study(out)
    recs = records_in(out)
    assert len(recs) == 2 * BLOCKS and all(r["status"] == "ok" for r in recs)
    assert sorted(r["study"]["arm"] for r in recs) == sorted(ARMS * BLOCKS)
    every, every_out = compare(out, tmp_path / "holm.json", "--metric", "*/busbw@*(GB/s)", "--metric",
                               "*/avg_busbw(GB/s)", "--alpha", "0.01")
    rows = [v for v in every["verdicts"] if v["control"]]
    m = len(rows)
    assert m == len(every["verdicts"]) >= 30  # 6 ops x 5 sizes + 6 op averages, all of the control
    assert all(v["design"] == f"interleaved ABBA, {BLOCKS} blocks" and v["tests"] == m for v in rows)
    raw = sum(v["p"] < ALPHA for v in rows)
    print(f"A/A: {raw} of {m} tests at p < {ALPHA} uncorrected; {every['control'][0]}")
    # Holm over 36 at alpha 0.01: nothing called, and every verdict one of the two words left
    assert not any(v["significant"] for v in rows), every_out
    assert all(v["verdict"].startswith(("equivalent within", "inconclusive: ")) for v in rows), every_out
    line = every_out.splitlines()[0]
    assert line.startswith(("A/A control: within +-", "A/A control: no bias found", "A/A control cannot speak")), line
    assert "quiet" not in every_out
    # the default: one primary verdict (all_reduce at the largest size), the rest exploratory
    default, default_out = compare(out, tmp_path / "default.json")
    primary = [v for v in default["verdicts"] if v["primary"]]
    assert [v["metric"] for v in primary] == ["all_reduce/busbw@262144(GB/s)"], default_out
    assert all(v["correction"] == "bh" for v in default["verdicts"] if not v["primary"])


def compare(out, dest, *extra) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "workloads.commands.cli", "compare", str(out), "--json", str(dest), *extra]
    res = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(dest.read_text()), res.stdout
