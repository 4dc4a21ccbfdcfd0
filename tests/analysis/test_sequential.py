"""A sequential study (`--until-decided --max-blocks N`) spends alpha over its looks in
proportion to their blocks and, by default, stops only on a difference called or equivalence
(analysis/looks.py), by simulation through the project's verdict code (fixed seeds; each
docstring gives the figures measured before the change, at the same seed, and after).

Tolerances are one-sided exact binomial bounds (helpers.binomial) on independent simulated
studies. The many-study rates are computed with the verdict's own t-test vectorised and checked
against analysis.stats verdict by verdict on a sample, so the file stays within seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis import looks, stats
from analysis.compare import compare_table, look_share
from analysis.load import Table, run_from_record
from helpers.binomial import at_least, at_most
from helpers.records import train_record

ALPHA, CV = 0.05, 0.05
SCHEDULE = looks.looks_at(16)


def _pvalues(d: np.ndarray) -> np.ndarray:
    """(studies, looks): the paired t-test's p at each look, as stats.paired_t computes it."""
    return np.stack([sps.ttest_1samp(d[:, :k], 0.0, axis=1).pvalue for k in SCHEDULE], axis=1)


def _calls(ps: np.ndarray, levels: list[float]) -> np.ndarray:
    """Whether each study calls a difference at some look (a call stops it)."""
    return np.any(ps < np.asarray(levels), axis=1)


def test_the_shares_of_alpha_follow_the_blocks_and_sum_to_one():
    """Looks after 3, 4, 6, 8, 12, 16 blocks (49 in all) spend 3/49 ... 16/49 of alpha; a look
    whose last runs failed is still that look; past the cap, the cap."""
    assert SCHEDULE == [3, 4, 6, 8, 12, 16] and looks.looks_at(32) == [3, 4, 6, 8, 12, 18, 24, 32]
    assert sum(looks.share(SCHEDULE, k) for k in SCHEDULE) == pytest.approx(1.0)
    assert looks.share(SCHEDULE, 3) == pytest.approx(3 / 49) and looks.share(SCHEDULE, 16) == pytest.approx(16 / 49)
    assert looks.share(SCHEDULE, 7) == looks.share(SCHEDULE, 8) and looks.share(SCHEDULE, 20) == looks.share(SCHEDULE, 16)
    with pytest.raises(ValueError, match="subset of difference, equivalence, futility"):
        looks.stop_on("difference,nothing")
    assert looks.stop_on("difference, futility") == ("difference", "futility")


def test_block_weighted_alpha_keeps_false_calls_and_raises_power():
    """One primary test, CV 5%, looks after 3-16 blocks, stopping at the first call. A/A (seed 42,
    4,000 studies): a call at any look, so at whichever look the study stops, 3.7% with alpha/6 at
    each look and 3.7% weighted by blocks (<= alpha). A true +5% (seed 43, 4,000): called in 47.8%
    with alpha/6 per look, 57.3% weighted (the review: 48.6% -> 57.8%). Each rate is the verdict
    code's: stats.compare at the look's share decides the same as the vectorised test."""
    n, sd = 4000, CV * math.sqrt(2)
    shares = [looks.share(SCHEDULE, k) for k in SCHEDULE]
    for seed, effect in ((42, 0.0), (43, 0.05)):
        d = math.log1p(effect) + np.random.default_rng(seed).normal(0, sd, (n, SCHEDULE[-1]))
        ps = _pvalues(d)
        equal = _calls(ps, [ALPHA / len(SCHEDULE)] * len(SCHEDULE))
        weighted = _calls(ps, [ALPHA * s for s in shares])
        if effect == 0:
            assert at_most(int(weighted.sum()), n, ALPHA), weighted.mean()
        else:
            assert at_least(int(weighted.sum()), n, 0.55) and at_most(int(equal.sum()), n, 0.52), \
                (equal.mean(), weighted.mean())
        for i in range(15):  # the verdict code agrees, look by look (a block that dominates aside)
            for j, k in enumerate(SCHEDULE):
                c = stats.compare([1.0] * k, [1.0] * k, "a", "b", "samples_per_sec", design=stats.Design(blocks=list(d[i, :k]), name="x"), judging=stats.Judging(looks=len(SCHEDULE), share=shares[j]))
                assert c.robust or c.significant == (ps[i, j] < ALPHA * shares[j]), (i, k, c.verdict)
                assert c.robust or c.conf == pytest.approx(1 - ALPHA * shares[j])


def test_futility_is_not_a_default_stop():
    """A true +2% at CV 1% in a study sized for 10% (cap 16, one test; seed 44, 100 studies, the
    verdict code and looks.stops at each look). Stopping once the interval rules out 10% (the
    old default, now `--stop-on ...,futility`) stops after 4.1 blocks on average and calls the 2% in
    4%; the default rule (a difference or equivalence) calls it in 99%, after 9.0 blocks on average."""
    rng = np.random.default_rng(44)
    n, called, blocks = 100, {r: 0 for r in ("default", "futility")}, {r: 0 for r in ("default", "futility")}
    for _ in range(n):
        d = math.log(1.02) + rng.normal(0, 0.01, 16) - rng.normal(0, 0.01, 16)
        left = {"default": looks.STOP_ON, "futility": looks.STOPS}
        for k in SCHEDULE:
            c = stats.compare([1.0] * k, [1.0] * k, "a", "b", "samples_per_sec", design=stats.Design(blocks=list(d[:k]), name="x"), judging=stats.Judging(looks=len(SCHEDULE), share=looks.share(SCHEDULE, k)))
            for rule, on in list(left.items()):
                if looks.stops(c, on) or k == SCHEDULE[-1]:
                    called[rule] += c.significant
                    blocks[rule] += k
                    del left[rule]
            if not left:
                break
    assert at_least(called["default"], n, 0.9) and called["futility"] / n < 0.4, (called, blocks)


def _sequential(held: int, cap: int = 16, n_looks: int = 6) -> Table:
    """Records of a sequential study (cap 16, 6 looks) holding blocks 0 .. held-1: roce 3% ahead."""
    rng = np.random.default_rng(held)
    runs, pos = [], 0
    for k in range(held):
        noise = rng.normal(0, 0.01)
        for arm, v in (("ib", 100.0), ("roce", 103.0 * math.exp(noise))):
            rec = train_record("loopback", v, trial=k, run_id=f"{arm}-{k}")
            rec["study"] = {"id": "s", "arm": arm, "baseline": "ib", "control": False, "block": k, "position": pos,
                            "design": "abba", "blocks": cap, "looks": n_looks}
            runs.append(run_from_record(rec))
            pos += 1
    return Table(runs)


def test_a_look_is_judged_at_its_share_read_from_the_records():
    """The records carry the cap (16) and the count of looks (6); the verdict of the look after 8
    blocks is judged at alpha x 8/49 = 0.00816 (a 99.18% interval), and says so; records whose
    look count is not looks_at's get alpha/looks, as before."""
    table = _sequential(8)
    assert look_share(table) == pytest.approx(8 / 49)
    ((_, c),) = compare_table(table, "ib").comparisons
    assert c.conf == pytest.approx(1 - ALPHA * 8 / 49) and "99.18% CI" in c.verdict
    assert "sequential: alpha spent over 6 looks in proportion to their blocks (16.3% of it at this look)" in c.verdict
    assert c.p_adj == pytest.approx(min(1.0, c.p * 49 / 8))
    odd = _sequential(8, n_looks=5)
    assert math.isnan(look_share(odd))
    ((_, c),) = compare_table(odd, "ib").comparisons
    assert c.conf == pytest.approx(1 - ALPHA / 5) and "in proportion" not in c.verdict
