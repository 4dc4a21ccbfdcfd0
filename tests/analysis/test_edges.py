"""Verdicts at the edges of real data, by simulation through the project's own verdict code
(fixed seeds; each docstring gives the figure before the fix, at the same seed, and after):
values printed with two decimals, one arm's occasional slow run, one outlier run, loose runs
whose counts and spreads differ, equivalence over a family, an extended study, and the words
a latency is said in.

Tolerances are one-sided exact binomial bounds (helpers.binomial) on independent simulated
studies. Each simulation is a few hundred studies, so the file stays within seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import stats
from analysis.compare import compare_table, spent_looks
from analysis.load import Table, run_from_record
from helpers.binomial import at_least, at_most
from helpers.records import train_record

ALPHA = 0.05


def _study(a: list[float], b: list[float], blocks_planned: list[int] | None = None) -> Table:
    """Two arms (baseline "ib", arm "roce"), one run each per block, ABBA order, as records."""
    runs, pos = [], 0
    for k, (va, vb) in enumerate(zip(a, b)):
        for arm, v in (("ib", va), ("roce", vb)) if k % 2 == 0 else (("roce", vb), ("ib", va)):
            rec = train_record("loopback", v, trial=k, run_id=f"{arm}-{k}")
            rec["study"] = {"id": "s", "arm": arm, "baseline": "ib", "control": False, "block": k, "position": pos,
                            "design": "abba", "blocks": (blocks_planned or [len(a)] * len(a))[k], "looks": 1}
            runs.append(run_from_record(rec))
            pos += 1
    return Table(runs)


def test_values_printed_to_two_decimals_are_never_equivalent_by_rounding():
    """S2. busbw ~0.03 GB/s printed to 0.01 (as nccl-tests prints it), a true +10%, CV 5%, 8
    blocks: most block log-ratios are 0, and a zero-spread d was taken as exact. Before: 42 of
    120 studies (seed 83) said "equivalent within +-2.0% ... [+0.0, +0.0]". After: none; the
    rounding's own variance, 2 (0.01/x)^2 / 12 per block on the log scale, floors the interval."""
    rng = np.random.default_rng(83)
    n, equivalent, zero_width = 120, 0, 0
    for _ in range(n):
        a = np.round(0.03 * np.exp(rng.normal(0, 0.05, 8)), 2)
        b = np.round(0.033 * np.exp(rng.normal(0, 0.05, 8)), 2)
        ((_, c),) = compare_table(_study(list(a), list(b)), "ib").comparisons
        equivalent += c.equivalent
        zero_width += c.tested and c.lo == c.hi
    assert equivalent == 0 and zero_width == 0, (equivalent, zero_width)
    # one constant block log-ratio with no known resolution is not "exact" either: not tested, said why
    c = stats.compare([1.0] * 4, [1.0] * 4, "a", "b", "samples_per_sec", design=stats.Design(blocks=[0.01] * 4, name="x"))
    assert not c.tested and "no resolution to bound their spread" in c.verdict
    assert stats.resolution([0.03, 0.59, 12.34]) == pytest.approx(0.01) and stats.resolution([3.0, 7.0]) == 1.0
    assert stats.resolution([100.123456789123]) == 0.0


def test_one_arms_rare_slowdown_is_flagged_and_never_equivalent():
    """S3. Arm B has a 10% chance per run of being 30% slower (a noisy neighbour), A none; 6
    blocks, CV 1%. The verdict's estimand is the typical run; when B's slow run is in the sample
    its block dominates, and the signed-rank test decides. Before (seed 63, 300 studies): 31.7%
    said "equivalent within +-2.0%" (a per-claim TOST allows 2.5%). After: 0%: never while a block
    is flagged, and never on fewer than 8 blocks (at 8, B's slow run is still absent from 43% of
    studies: the docs say what equivalence cannot see), and the interval
    covers the typical run's ratio (the median of d, -0.2%) in 94.7% (95.7% before: what the
    data can show did not change; what is claimed from it did)."""
    rng = np.random.default_rng(63)
    n, equivalent, covered, flagged = 300, 0, 0, 0
    for _ in range(n):
        a = rng.normal(0, 0.01, 6)
        b = rng.normal(0, 0.01, 6) + math.log(0.7) * (rng.random(6) < 0.1)
        c = stats.compare([1.0] * 6, [1.0] * 6, "b", "a", "samples_per_sec", design=stats.Design(blocks=list(b - a), name="sim"))
        equivalent += c.equivalent
        covered += c.lo <= math.exp(-0.002) <= c.hi
        flagged += bool(c.robust)
    assert at_most(equivalent, n, ALPHA) and at_least(covered, n, 0.90), (equivalent, covered)
    assert at_least(flagged, n, 1 - 0.9 ** 6 - 0.1)  # B's slow run is in 47% of studies, and is seen


def test_one_outlier_run_does_not_silence_a_study():
    """S6. Exactly one of 16 runs 30% slower (random arm and block), k = 8, CV 2%, a true +5%.
    Before (seed 65, 300 studies): called in 4.3% (the outlier inflates the t-test's sd). After:
    42.3%, the signed-rank test deciding on the flagged block, and the verdict names it. Under
    A/A (seed 64) the rule stays valid: 5.0% false calls (0.0% before: valid, and useless)."""
    def run(eff: float, seed: int) -> tuple[int, int]:
        rng = np.random.default_rng(seed)
        calls = named = 0
        for _ in range(300):
            a, b = rng.normal(0, 0.02, 8), math.log1p(eff) + rng.normal(0, 0.02, 8)
            (a if rng.random() < 0.5 else b)[rng.integers(8)] += math.log(0.7)
            c = stats.compare([1.0] * 8, [1.0] * 8, "b", "a", "samples_per_sec", design=stats.Design(blocks=list(b - a), name="sim"))
            calls += c.significant
            named += "decided by the signed-rank test" in c.verdict
        return calls, named

    calls, named = run(0.05, 65)
    assert at_least(calls, 300, 0.30) and named > 250, (calls, named)
    calls, _ = run(0.0, 64)
    assert at_most(calls, 300, ALPHA), calls


def test_loose_runs_with_unequal_counts_and_spreads_hold_alpha():
    """S4. No blocks: 4 noisy runs (CV 10%) against 8 quiet ones (CV 1%), equal medians. The
    exact Mann-Whitney test is not a test of location when spreads differ. Before (seed 73, 300
    studies): 13.7% false calls. After, Welch's t on the logs: 5.0%. And a corrected p below
    alpha is never printed "inconclusive" (ties: values printed to 0.01, 6 vs 6, true +8%,
    seed 79: 6 of 40 before, 0 after)."""
    rng = np.random.default_rng(73)
    n, calls = 300, 0
    for _ in range(n):
        c = stats.compare(list(100 * np.exp(rng.normal(0, 0.10, 4))), list(100 * np.exp(rng.normal(0, 0.01, 8))),
                          "b", "a", "samples_per_sec")
        calls += c.significant
    assert at_most(calls, n, ALPHA), calls
    rng = np.random.default_rng(79)
    disagree = 0
    for _ in range(40):  # ties: the exact rank p printed beside is a 20,000-permutation one, the slow part
        c = stats.compare(list(np.round(0.5 * 1.08 * np.exp(rng.normal(0, 0.05, 6)), 2)),
                          list(np.round(0.5 * np.exp(rng.normal(0, 0.05, 6)), 2)), "b", "a", "samples_per_sec")
        disagree += (c.p_adj < ALPHA) != c.significant
    assert disagree == 0, disagree


def test_equivalence_is_tost_at_90_percent_and_protected_over_the_family():
    """S9. Equivalence is two one-sided tests at alpha/(m x looks) each: the 1 - 2 alpha/m
    interval (90% for one test) inside the margin, Bonferroni over the family, printed as its own
    interval. Before, it was read off Holm's per-test interval (95% for one test: 20-30% more
    blocks per claim), and a family of ten verdicts at the margin's edge, each also significant,
    said a false "within +-2.0%" in 5.7% of studies (the review, 100,000 studies). The
    simulation here (five verdicts all truly +2.0%, sd 0.4%, 12 blocks, seed 22, 60 studies:
    1 study before and after) guards the bound; the 90% and 95% intervals are what fail before."""
    one = stats.compare([1.0] * 8, [1.0] * 8, "a", "b", "samples_per_sec", design=stats.Design(blocks=[0.001, -0.002] * 4, name="x"))
    assert one.eq_conf == pytest.approx(0.90) and one.equivalent and "its 90% interval [" in one.verdict
    two = stats.correct([one, one], "holm")[0]
    assert two.eq_conf == pytest.approx(0.95)  # 1 - 2 alpha / 2: Bonferroni over the family
    rng = np.random.default_rng(22)
    n, false_eq = 60, 0
    for _ in range(n):
        fam = [stats.compare([1.0] * 12, [1.0] * 12, f"a{i}", "b", "samples_per_sec", design=stats.Design(name="sim", blocks=list(math.log(1.02) + rng.normal(0, 0.004, 12)))) for i in range(5)]
        false_eq += any(c.equivalent for c in stats.correct(fam, "holm"))
    assert at_most(false_eq, n, ALPHA), false_eq


def test_an_extended_study_spends_alpha_over_its_sizes():
    """S1. Records of one study planned at 8 blocks and then at 16 (an extension after its verdict
    was printed) are two looks: alpha/2 at the second, never a fresh full alpha; `fabricbench
    study` refuses the extension itself (tests/study). A/A, CV 3%, extended 8 -> 12 when the
    8-block verdict called nothing (seed 46, 300 studies): before, a call at 8 or at 12 blocks in
    6.7% (the review, 2,000 studies, 8 -> 16: 9.1%); after, with the 8-block verdict as it was
    printed (full alpha) and the 12-block one at alpha/2: 5.7%, within alpha's binomial
    tolerance (12, not 16 blocks: up to 14 the sign-flip check is enumerated, past it sampled)."""
    table = _study([100.0, 101.0, 99.0, 100.5] * 4, [100.5, 100.0, 99.5, 101.0] * 4, [8] * 8 + [16] * 8)
    ((_, c),) = compare_table(table, "ib").comparisons
    assert spent_looks(table) == 2 and c.looks == 2 and "alpha spent over 2 looks" in c.verdict
    rng = np.random.default_rng(46)
    n, calls = 300, 0
    for _ in range(n):
        d = rng.normal(0, 0.03, 12) - rng.normal(0, 0.03, 12)
        c = stats.compare([1.0] * 8, [1.0] * 8, "b", "a", "samples_per_sec", design=stats.Design(blocks=list(d[:8]), name="x"))
        if not c.significant:
            c = stats.compare([1.0] * 12, [1.0] * 12, "b", "a", "samples_per_sec", design=stats.Design(blocks=list(d), name="x"), judging=stats.Judging(looks=2))
        calls += c.significant
    assert at_most(calls, n, ALPHA), calls


@pytest.mark.parametrize("arm, base, metric, hib, start", [
    # a halved TTFT: 50% lower, never "100% faster"
    ([50.0, 50.4, 49.6, 50.2], [100.0, 100.5, 99.5, 100.1], "median_ttft_ms", False, "roce's median_ttft_ms is 50.0% lower than ib's ["),
    # roce's p99 TTFT 25% higher: ib's is 20% lower (its own change), never "ib is faster by 25%"
    ([125.0, 125.5, 124.5, 125.2], [100.0, 100.5, 99.5, 100.1], "p99_ttft_ms", False, "ib's p99_ttft_ms is 20."),
    # a rate keeps its speed wording
    ([200.0, 201.0, 199.0, 200.5], [100.0, 100.5, 99.5, 100.1], "samples_per_sec", True, "roce is faster than ib by 100."),
])
def test_latency_is_worded_as_lower_or_higher(arm, base, metric, hib, start):
    """S13. A lower-is-better metric is said as its own change ("x% lower", always below 100%);
    before, a halved TTFT printed "roce is faster than ib by 99.0%"."""
    c = stats.compare(arm, base, "roce", "ib", metric, judging=stats.Judging(higher_is_better=hib))
    assert c.verdict.startswith(start), c.verdict
    if not hib:
        assert "faster" not in c.verdict and 0 < stats.edge(c)[2] < 1


def test_counts_are_judged_by_their_paired_raw_differences():
    """S11. A count (tcp retransmits) in a study is judged by the blocks' raw differences, arm -
    baseline per run, with the same paired t-test, and said in its own units, never "x% better":
    a zero leaves no log-ratio, and A/A retransmits ~ Poisson(3) over 8 blocks had one in 53% of
    studies, which went untested (before, seed 81: "not tested ... ib better than roce by 25.0%
    (exact rank test, run order not recorded)"). Worked values first, then by simulation (seed 82,
    120 studies each, Poisson(3) per run): none untested; A/A called in 9 (7.5%: alpha's binomial
    tolerance; the same t on 20,000 such studies calls 5.0%); a true +2 per run called in 64 (53%,
    about the t-test's power there, sd of d sqrt 6 over 8 blocks)."""
    ib, roce = [0, 2, 3, 1, 4, 2, 0, 3], [1, 4, 3, 2, 6, 2, 1, 5]   # d = 1, 2, 0, 1, 2, 0, 1, 2
    table = _study([1.0] * 8, [1.0] * 8)
    for r in table:
        r.metrics["tcp_retransmits"] = float((roce if r.fabric == "roce" else ib)[r.study["block"]])
    (c,) = [c for _, c in compare_table(table, "ib", metrics=["tcp_retransmits"]).comparisons]
    d = np.array([1, 2, 0, 1, 2, 0, 1, 2], dtype=float)
    assert d.std(ddof=1) == pytest.approx(0.834523, abs=1e-6)
    assert c.raw and c.tested and c.data == tuple(d) and c.ratio == pytest.approx(1.125)
    # 1.125 -+ t(0.975, 7) x 0.834523 / sqrt 8 = 1.125 -+ 2.364624 x 0.295048
    assert (c.lo, c.hi) == (pytest.approx(0.427321, abs=1e-6), pytest.approx(1.822679, abs=1e-6))
    assert c.p == pytest.approx(0.006603, abs=1e-6)  # t = 1.125 / 0.29505 = 3.8130, df 7
    assert c.significant and not c.equivalent and not c.rules_out  # neither is claimed of a difference
    assert c.verdict.startswith("ib's tcp_retransmits is 1.12 lower than roce's per run [0.427, 1.82] (95% CI; "
                                "paired t p=0.0066"), c.verdict
    assert "interleaved ABBA, 8 blocks, paired differences per run" in c.verdict and "%" not in c.verdict.split("(")[0]
    # a zero in the baseline's blocks: the same test, where a log-ratio has none to take
    rng = np.random.default_rng(82)
    n, untested, false, called = 120, 0, 0, 0
    for _ in range(n):
        for shift, in ((0,), (2,)):
            t = _study([1.0] * 8, [1.0] * 8)
            for r in t:
                r.metrics["tcp_retransmits"] = float(rng.poisson(3) + (shift if r.fabric == "roce" else 0))
            (c,) = [c for _, c in compare_table(t, "ib", metrics=["tcp_retransmits"]).comparisons]
            untested += not c.tested
            false += shift == 0 and c.significant
            called += shift == 2 and c.significant
    assert untested == 0 and at_most(false, n, ALPHA) and at_least(called, n, 0.4), (untested, false, called)


def _williams_study(seed: int, carry: float) -> Table:
    """ib, roce (equal to ib) and the A/A control ib~aa, 12 blocks of the Williams schedule,
    CV 1%; every run right after a roce run is `carry` slower (PFC or ECN state left behind)."""
    from workloads.study.schedule import schedule

    rng = np.random.default_rng(seed)
    runs, prev = [], None
    for c in schedule(["ib", "roce", "ib~aa"], 12, "williams", seed):
        v = 100 * math.exp(rng.normal(0, 0.01)) * (1 - carry * (prev == "roce"))
        rec = train_record("loopback", v, trial=c.block, run_id=f"{c.arm}-{c.block}")
        rec["study"] = {"id": "s", "arm": c.arm, "baseline": "ib", "control": c.arm == "ib~aa", "block": c.block,
                        "position": c.position, "design": "williams", "blocks": 12, "looks": 1}
        runs.append(run_from_record(rec))
        prev = c.arm
    return Table(runs)


def test_a_carry_over_from_the_real_arm_is_flagged():
    """S7. Every run right after a roce run is 3% slower; roce itself equals ib. The A/A control
    cannot see it, and before it said "no bias found" or "equivalent" while roce was called
    different (here 29 of 40 studies, seeds 91 + i; the review: 69% of 250), and nothing flagged
    it. A least-squares model with the previous arm's term (the positions are in the records)
    flags it in 40 of 40, with the carry-adjusted roce vs ib interval covering 0 in 39; without a
    carry-over (seeds 191 + i) it flags 2 of 40, within alpha."""
    flagged = covered = 0
    for i in range(40):
        res = compare_table(_williams_study(91 + i, 0.03), "ib")
        lines = res.carry_lines()
        flagged += bool(lines)
        if lines:
            lo, hi = (float(v) for v in lines[0].rsplit("roce vs ib ", 1)[1].split("[")[1].rstrip("]").split(", "))
            covered += lo <= 0 <= hi
        assert lines == [] or lines[0] in res.notes()
    assert flagged >= 36 and covered >= 34, (flagged, covered)
    false = sum(bool(compare_table(_williams_study(191 + i, 0.0), "ib").carry_lines()) for i in range(40))
    assert at_most(false, 40, ALPHA), false


def test_signed_rank_matches_scipy_and_its_interval_agrees_with_its_test():
    """The robust test is the exact Wilcoxon signed-rank test (scipy.stats.wilcoxon gives the
    same p on untied data), and its Hodges-Lehmann interval excludes 0 exactly when p < 1 - conf."""
    from scipy import stats as sps

    rng = np.random.default_rng(5)
    for _ in range(200):
        d = rng.normal(0.02, 0.03, 8)
        est, lo, hi, p = stats.signed_rank(d)
        assert p == pytest.approx(sps.wilcoxon(d, method="exact").pvalue)
        assert (p < 0.05) == (lo > 0 or hi < 0) and lo <= est <= hi
    assert stats.signed_rank([0.1, 0.2, 0.3])[1:3] == (-math.inf, math.inf)  # 3 blocks: no level below 0.25
