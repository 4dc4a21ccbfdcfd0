"""A real A/A study on CPU: the same fabric under two arm labels, interleaved ABBA, many tests.

2 ranks over Gloo on loopback run 6 collectives ops at 5 message sizes each, 6 blocks (trials
per arm), the arms alternating ABBA with the study's record fields set by the `study=`
override, exactly as `fabricbench study` sets them. Every (op, size) busbw and every op's
average busbw is a test of "control vs baseline" (36 tests). Nothing differs but the label,
so the uncorrected false positives must stay at the nominal 5% within binomial tolerance,
and the corrected control must be quiet. The 36 tests of one study are not independent: a
block whose second run happened to be slower moves every op and size the same way, so false
calls come in clusters. The tolerance is therefore taken over the effective number of
independent tests (Li & Ji 2005: from the eigenvalues of the correlation matrix of the
metrics' per-block log ratios), not over 36 as if each were a coin of its own. 6 blocks because fewer can never call anything (the
blocked test's floor is 2/2^blocks): a quiet A/A of 4 blocks would prove nothing. For the
same reason Holm over 36 tests (which would need 11 blocks) is checked to say it cannot
speak, and the family-wise check is made with Benjamini-Hochberg, which can call at 6 blocks.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from analysis.load import size_metrics

from tests.conftest import REPO, child_env, records_in, run_entry
from tests.test_analysis_design import ALPHA, binomial_bound

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
@pytest.mark.timeout(1800)  # 12 runs: ~3 minutes on an idle 2-core machine, 10+ when it is shared
def test_real_aa_study_stays_quiet(tmp_path):
    out = tmp_path / "results"
    run_study(out)
    recs = records_in(out)
    assert len(recs) == 2 * BLOCKS and all(r["status"] == "ok" for r in recs)
    assert sorted(r["study"]["arm"] for r in recs) == sorted(ARMS * BLOCKS)
    holm, holm_out = compare(out, tmp_path / "holm.json")
    bh, bh_out = compare(out, tmp_path / "bh.json", "--correction", "bh")
    rows = [v for v in bh["verdicts"] if v["control"]]
    m = len(rows)
    assert m == len(bh["verdicts"]) >= 30  # 6 ops x 5 sizes + 6 op averages, all of the control
    assert all(v["design"] == f"interleaved ABBA, {BLOCKS} blocks" and v["tests"] == m for v in rows)
    false_pos = sum(v["p"] < ALPHA for v in rows)
    m_eff = effective_tests(recs, [v["metric"] for v in rows])
    print(f"A/A: {false_pos} of {m} tests at p < {ALPHA} uncorrected ({false_pos / m:.1%}; {m_eff:.1f} effective "
          f"tests); {bh['control'][0]}")
    # uncorrected: at most the nominal rate within its binomial tolerance over the effective
    # number of tests (each test's own level is 2/64 = 3.1% at 6 blocks)
    assert 1 <= m_eff <= m
    assert false_pos <= binomial_bound(m, effective=m_eff), (false_pos, m, m_eff, bh_out)
    # family-wise: under an A/A (every null true) BH's false-discovery rate is the chance of any
    # false call, and BH can call at 6 blocks; quiet is the verdict.
    assert bh_out.splitlines()[0].startswith(f"A/A control: quiet — 0 of {m} tests significant after "
                                             f"Benjamini-Hochberg"), bh_out
    # Holm over 36 tests cannot call anything at 6 blocks (36 x 2/64 > 1): the control says so
    # instead of claiming to be quiet, and no verdict is significant.
    assert holm_out.splitlines()[0].startswith("A/A control: cannot speak — no test could reach p < 0.05 after Holm "
                                               f"over {m} tests"), holm_out
    assert not any(v["significant"] for v in rows + holm["verdicts"])


def effective_tests(recs: list[dict], metrics: list[str]) -> float:
    """Li & Ji's effective number of independent tests: sum over the eigenvalues l of the
    metrics' correlation matrix (across blocks, of log control/baseline) of [l >= 1] + frac(l)."""
    by = {(r["study"]["block"], r["study"]["arm"]): r["metrics"] | size_metrics(r["rows"]) for r in recs}
    blocks = sorted({b for b, _ in by})
    d = np.array([[math.log(by[(b, ARMS[1])][k] / by[(b, ARMS[0])][k]) for b in blocks] for k in metrics])
    eig = np.abs(np.linalg.eigvalsh(np.corrcoef(d)))
    return float(sum((x >= 1) + (x - math.floor(x)) for x in eig))


def compare(out, dest, *extra) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "workloads.core.cli", "compare", str(out), "--metric", "*/busbw@*(GB/s)",
           "--metric", "*/avg_busbw(GB/s)", "--json", str(dest), *extra]
    res = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(dest.read_text()), res.stdout
