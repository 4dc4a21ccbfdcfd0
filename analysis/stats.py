"""Statistics over trials, from scipy.stats: medians with bootstrap intervals, ratios, exact
tests that respect the run order, and a correction over every verdict of a study.

A trial is one record (one run of the workload at one point). Per-step samples are not
trials: steps of one run share a process, a placement, NCCL's ring/channel choices and
the network path, so they are correlated; treating them as independent would shrink the
intervals to nothing and call noise significant (pseudo-replication). Each record's
metric is already computed as the records define it (training: mean step time after
`samples.warmup_steps`), and is taken as is.

Two tests, chosen by what the records say about the order they ran in:

- Blocked (records of a `fabricbench study`: record["study"] has a block per run). Each
  block holds every arm once (or equally often), run close together, so drift of the
  machine over the study hits both arms of a block alike. The test statistic is the mean
  over blocks of the within-block log-ratio d_k = mean log(arm) - mean log(baseline); under
  "no arm effect" each d_k is as likely negative as positive (ABBA: the order within a
  block alternates; permuted: it is randomised), so its exact null distribution is the 2^k
  sign flips (scipy.stats.permutation_test, permutation_type="samples"). The ratio is the
  geometric mean of the per-block ratios, exp(mean d), with a percentile bootstrap over
  blocks (scipy.stats.bootstrap). Its floor: two-sided p >= 2/2^k, so 4 blocks reach 0.125,
  5 blocks 0.0625 and 6 blocks 0.031: a blocked study needs >= 6 blocks (trials per arm) to
  ever call a difference at alpha = 0.05, more under a correction (Holm over m tests needs
  m * 2/2^k < alpha: 10 blocks for 18 tests).
- Exact rank test (no design recorded: trials run in an unknown order, or one label after
  the other). A two-sided Mann-Whitney (Wilcoxon rank-sum) test with its exact permutation
  distribution (scipy.stats.mannwhitneyu; method "exact" without ties; with ties mid-ranks
  and scipy's PermutationMethod, every relabelling enumerated up to 20,000, else 20,000
  seeded random ones). Why ranks: run times are skewed, not normal (no t-test), and one
  outlier trial does not decide. Its floor: 2/C(2n, n), so 2 vs 2 trials never reach
  significance (p >= 0.33), 3 vs 3 reach 0.1, 4 vs 4 0.029. It assumes all trials are
  exchangeable, which drift between the two labels' runs breaks: its verdict says the run
  order was not recorded. The ratio is median/median with each group bootstrapped apart.

Correction: every verdict of one study (one family per study, and the A/A control arm's
tests as a family of their own) is corrected together: Holm's step-down (family-wise error,
the default; scipy has no Holm, so it is the six lines of `holm` below) or Benjamini-Hochberg
(false-discovery rate, scipy.stats.false_discovery_control). A verdict names a winner only
when the corrected p < alpha AND the ratio's interval excludes 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
from scipy import stats as sps

N_BOOT = 10_000
MAX_EXACT = 20_000
CORRECTIONS = ("holm", "bh", "none")
CORRECTION_NAMES = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no correction"}


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(0 if seed is None else seed)  # fixed: a report is reproducible


def _percentile_bootstrap(data: tuple, statistic, conf: float, n_boot: int, seed: int | None) -> tuple[float, float]:
    # percentile, not BCa: BCa's jackknife is undefined for the few, often tied, trials of a benchmark
    res = sps.bootstrap(data, statistic, n_resamples=n_boot, confidence_level=conf, method="percentile",
                        vectorized=True, rng=_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_median(x: Sequence[float], conf: float = 0.95, n_boot: int = N_BOOT, seed: int | None = None) -> tuple[float, float, float]:
    """(median, lo, hi): percentile bootstrap interval of the median."""
    a = np.asarray(x, dtype=float)
    if a.size == 0:
        return (math.nan,) * 3
    med = float(np.median(a))
    if a.size == 1 or np.all(a == a[0]):
        return med, med, med
    lo, hi = _percentile_bootstrap((a,), lambda s, axis: np.median(s, axis=axis), conf, n_boot, seed)
    return med, lo, hi


def bootstrap_ratio(a: Sequence[float], b: Sequence[float], conf: float = 0.95, n_boot: int = N_BOOT,
                    seed: int | None = None) -> tuple[float, float, float]:
    """(median(a)/median(b), lo, hi), each group resampled independently."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ratio = float(np.median(x) / np.median(y))
    if (x.size < 2 and y.size < 2) or (np.all(x == x[0]) and np.all(y == y[0])):
        return ratio, ratio, ratio
    if x.size < 2 or y.size < 2:  # one trial on a side: a constant; only the other side varies
        _, lo, hi = bootstrap_median(y if x.size < 2 else x, conf, n_boot, seed)
        return (ratio, float(x[0] / hi), float(x[0] / lo)) if x.size < 2 else (ratio, float(lo / y[0]), float(hi / y[0]))
    lo, hi = _percentile_bootstrap((x, y), lambda s, t, axis: np.median(s, axis=axis) / np.median(t, axis=axis),
                                   conf, n_boot, seed)
    return ratio, lo, hi


def permutation_p(a: Sequence[float], b: Sequence[float], seed: int | None = None) -> float:
    """Two-sided p-value of the Mann-Whitney rank-sum test, exact under exchangeability.

    Without ties scipy's "exact" distribution; with ties its permutation distribution of the
    mid-rank statistic (the "exact" table assumes no ties). Two-sided is twice the smaller
    tail (scipy's convention; with ties the rank-sum's distribution is not symmetric)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        return math.nan
    both = np.concatenate([x, y])
    if np.unique(both).size == both.size:
        return float(sps.mannwhitneyu(x, y, alternative="two-sided", method="exact").pvalue)
    method = sps.PermutationMethod(n_resamples=MAX_EXACT, rng=_rng(seed))
    return float(sps.mannwhitneyu(x, y, alternative="two-sided", method=method).pvalue)


def sign_flip_p(d: Sequence[float], seed: int | None = None) -> float:
    """Two-sided p of mean(d) against its 2^k sign flips (every flip enumerated up to 14 blocks, else 20,000 seeded)."""
    a = np.asarray(d, dtype=float)
    if a.size == 0:
        return math.nan
    if np.all(a == 0):
        return 1.0
    res = sps.permutation_test((a,), lambda s, axis: np.mean(s, axis=axis), permutation_type="samples",
                               vectorized=True, n_resamples=MAX_EXACT, alternative="two-sided", rng=_rng(seed))
    return float(res.pvalue)


def blocked_ratio(d: Sequence[float], conf: float = 0.95, n_boot: int = N_BOOT, seed: int | None = None) -> tuple[float, float, float]:
    """(exp(mean d), lo, hi): geometric-mean ratio of per-block log-ratios d, bootstrapped over blocks."""
    a = np.asarray(d, dtype=float)
    r = float(np.exp(a.mean()))
    if a.size < 2 or np.all(a == a[0]):
        return r, r, r
    lo, hi = _percentile_bootstrap((a,), lambda s, axis: np.mean(s, axis=axis), conf, n_boot, seed)
    return r, float(np.exp(lo)), float(np.exp(hi))


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values: p_(i) * (m - i + 1), made monotone, capped at 1."""
    a = np.asarray(p, dtype=float)
    order = np.argsort(a, kind="mergesort")
    m = a.size
    adj = np.minimum(1.0, np.maximum.accumulate(a[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adj
    return out


def adjust(p: Sequence[float], method: str) -> np.ndarray:
    """Corrected p-values of one family: "holm", "bh" (Benjamini-Hochberg) or "none"."""
    a = np.asarray(p, dtype=float)
    if a.size == 0 or method == "none":
        return a.copy()
    if method == "holm":
        return holm(a)
    if method == "bh":
        return sps.false_discovery_control(a, method="bh")
    raise ValueError(f"correction {method!r}: one of {', '.join(CORRECTIONS)}")


@dataclass(frozen=True)
class Comparison:
    """One arm against the baseline at one point, on one metric."""

    metric: str
    fabric: str           # the arm's label (record["study"]["arm"], else the fabric's name)
    baseline: str
    n: int
    n_base: int
    median: float
    median_base: float
    ratio: float          # arm / baseline in the metric's own units (blocked: geometric mean of block ratios)
    lo: float
    hi: float
    p: float
    speedup: float        # >1: the arm is faster (ratio, inverted for lower-is-better metrics)
    speedup_lo: float
    speedup_hi: float
    significant: bool
    verdict: str
    word: str = "faster"
    design: str = "exact rank test, run order not recorded"
    blocks: int = 0       # blocks paired (blocked test); 0 for the rank test
    p_adj: float = math.nan   # corrected over the family; NaN when not tested
    correction: str = "holm"
    family: int = 1       # tests in the correction's family
    control: bool = False     # the arm is the study's A/A control (a duplicate of the baseline)
    alpha: float = 0.05
    floor: float = math.nan   # the smallest p the test can give with these trials (NaN: not tested)

    @property
    def floor_adj(self) -> float:
        """The smallest corrected p any test of this family could reach: Holm multiplies the
        smallest p by the family's size; BH leaves a family of equal smallest p's as is."""
        return min(1.0, self.floor * self.family) if self.correction == "holm" else self.floor

    @property
    def can_call(self) -> bool:
        return self.tested and self.floor_adj < self.alpha

    @property
    def tested(self) -> bool:
        return not math.isnan(self.p)


def compare(values: Sequence[float], base: Sequence[float], fabric: str, baseline: str, metric: str,
            higher_is_better: bool = True, alpha: float = 0.05, conf: float = 0.95, seed: int | None = None,
            word: str = "faster", blocks: Sequence[float] | None = None, design: str | None = None,
            control: bool = False) -> Comparison:
    """`fabric` against `baseline` on one metric's per-trial values, as a family of one test
    (`correct` re-words it once the whole family is known). `blocks`: the per-block
    log-ratios of a blocked design (then the blocked test is used; `design` names it);
    None: the exact rank test. `word` names the winner's edge: "faster" for times and
    rates, "better" for the rest (comm share, loss, failures)."""
    x, y = list(values), list(base)
    if blocks is not None:
        # no complete block (every pair lost a side): the medians' ratio is shown, not tested
        ratio, lo, hi = blocked_ratio(blocks, conf=conf, seed=seed) if len(blocks) else bootstrap_ratio(x, y, conf=conf, seed=seed)
        p = sign_flip_p(blocks, seed=seed) if len(blocks) >= 2 else math.nan
        floor = min(1.0, 2 / 2 ** len(blocks))  # all blocks one way: 1 of 2^k flips per tail
    else:
        ratio, lo, hi = bootstrap_ratio(x, y, conf=conf, seed=seed)
        p = permutation_p(x, y, seed=seed) if len(x) >= 2 and len(y) >= 2 else math.nan
        floor = min(1.0, 2 / math.comb(len(x) + len(y), len(x)))  # fully separated: 1 of C(n+m, n) per tail
    # "faster" in speed terms: throughput ratio, or the inverse ratio of a time/latency
    s, slo, shi = (ratio, lo, hi) if higher_is_better else (1 / ratio, 1 / hi, 1 / lo)
    c = Comparison(metric, fabric, baseline, len(x), len(y), float(np.median(x)), float(np.median(y)),
                   ratio, lo, hi, p, s, slo, shi, False, "", word, design or Comparison.design,
                   0 if blocks is None else len(blocks), p, control=control, alpha=alpha,
                   floor=floor if not math.isnan(p) else math.nan)
    return correct([c], "holm", alpha)[0]


def correct(family: Sequence[Comparison], method: str = "holm", alpha: float = 0.05) -> list[Comparison]:
    """The family's comparisons with corrected p, significance and verdict; untested ones
    (too few trials) are not counted as tests."""
    tested = [i for i, c in enumerate(family) if c.tested]
    padj = adjust([family[i].p for i in tested], method)
    out = list(family)
    for i, pa in zip(tested, padj):
        out[i] = replace(family[i], p_adj=float(pa), correction=method, family=len(tested), alpha=alpha)
    for i, c in enumerate(out):
        if i not in tested:
            c = replace(c, correction=method, family=len(tested), alpha=alpha)
        sig = bool(c.tested and c.p_adj < alpha and (c.speedup_lo > 1 or c.speedup_hi < 1))
        out[i] = replace(c, significant=sig, verdict=verdict(c, sig))
    return out


def blocks_needed(tests: int, alpha: float, correction: str) -> int:
    """Fewest blocks with which the blocked test can call a difference: 2/2^k (x tests under Holm) < alpha."""
    m = tests if correction == "holm" else 1
    return math.floor(math.log2(2 * m / alpha)) + 1


def method_note(c: Comparison) -> str:
    """'interleaved ABBA, 6 blocks, Holm over 18 tests'"""
    corr = "no correction" if c.correction == "none" else \
        f"{CORRECTION_NAMES[c.correction]} over {c.family} test{'s' if c.family != 1 else ''}"
    return f"{c.design}, {corr}"


def edge(c: Comparison) -> tuple[str, str, float, float, float]:
    """(leader, trailer, fraction, lo, hi): the side with the better median, by how much as a
    fraction of the trailer (0.299 = 29.9% faster), and that fraction's interval. The one way a
    ratio is put into words: the verdict sentence and the report's tables both use it."""
    s, slo, shi = c.speedup, c.speedup_lo, c.speedup_hi
    if s >= 1:
        return c.fabric, c.baseline, s - 1, slo - 1, shi - 1
    return c.baseline, c.fabric, 1 / s - 1, 1 / shi - 1, 1 / slo - 1


def verdict(c: Comparison, sig: bool) -> str:
    """One convention for every outcome: name the side with the better median first and say
    by how much, with the interval of that same percentage (a signed "-25.6%" leaves the
    reader guessing who is behind). Not significant: the same sentence, prefixed, and its
    interval may cross 0 (negative = the other side is ahead)."""
    word = c.word
    if not c.tested:
        need = "2 blocks, >= 6 to detect a difference" if c.blocks or "block" in c.design else ">= 2 each, >= 4 to detect a difference"
        lead, trail, pct, _, _ = edge(c)
        return (f"insufficient trials ({c.n} vs {c.n_base}{f', {c.blocks} block(s)' if c.blocks else ''}; need {need}): "
                f"{lead} {word} than {trail} by {100 * pct:.1f}%, not tested ({c.design})")
    lead, trail, pct, plo, phi = edge(c)
    n1, n2 = (c.n, c.n_base) if lead == c.fabric else (c.n_base, c.n)
    sign = "" if sig else "+"
    corrected = "" if c.correction == "none" else f", corrected p={c.p_adj:.3g}"
    tail = f"[{100 * plo:{sign}.1f}, {100 * phi:{sign}.1f}] (p={c.p:.3g}{corrected}, n={n1} vs {n2}; {method_note(c)})"
    if sig:
        return f"{lead} is {word} than {trail} by {100 * pct:.1f}% {tail}"
    if c.speedup == 1:
        return f"not significant: {c.fabric} and {c.baseline} have equal medians {tail}"
    return f"not significant: {lead} is {word} than {trail} by {100 * pct:.1f}% {tail}"
