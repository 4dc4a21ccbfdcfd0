"""Statistics over trials, from scipy.stats: one test and one interval per verdict that agree,
an equivalence reading of that interval, the effect a study could detect, and a correction
over every verdict of a family.

A trial is one record (one run of the workload at one point). Per-step samples are not
trials: steps of one run share a process, a placement, NCCL's ring/channel choices and
the network path, so they are correlated; treating them as independent would shrink the
intervals to nothing and call noise significant (pseudo-replication). Each record's
metric is already computed as the records define it (training: mean step time after
`samples.warmup_steps`), and is taken as is.

Two paths, chosen by what the records say about the order they ran in:

- Blocked (records of a `fabricbench study`: each run carries its block). A block holds
  every arm once, run close together, so drift hits both arms of a block alike. The data
  are the within-block log-ratios d_k = mean log(arm) - mean log(baseline). The verdict's
  test is the paired t-test on d (scipy.stats.ttest_1samp) and its interval is that test's
  t-interval, exp'd: a ratio interval that excludes 1 exactly when the test rejects. Why t
  and not the exact sign-flip test alone: the sign-flip test's smallest two-sided p is
  2/2^k (0.125 at 4 blocks), so small studies could never call anything, and the
  percentile bootstrap interval it was paired with covered 82-90% at 4-8 blocks, not 95%.
  The t-test is calibrated on real heavy-tailed A/A pools (tests/analysis/test_aa.py); the
  exact sign-flip p is computed and printed beside as a robustness check. When one or two
  blocks dominate (outliers(): farther from the median than clean data allows) the exact
  Wilcoxon signed-rank test and its Hodges-Lehmann interval decide instead, and say so.
- Loose runs (no design recorded). Welch's t-test on the log values with its own interval
  (scipy.stats.ttest_ind, equal_var=False): valid when the arms' counts and spreads differ,
  where a rank test is not a test of location. The exact Mann-Whitney p is printed beside.
  The test assumes trials are exchangeable, which drift between labels breaks, and its
  verdict says the order was not recorded.

On both paths the values' recorded resolution (resolution(): 0.01 for busbw printed with two
decimals) floors the spread: a zero spread is rounding, never certainty.

Every verdict is one of three, never a bare "not significant":
- *A is x% faster [CI]* (a lower-is-better metric: *A's m is x% lower*, its own change): the
  corrected test rejects (the interval excludes 1);
- *equivalent within +-m*: two one-sided tests at alpha x s/tests each (s: the look's share of
  alpha, 1 outside a sequential study), that is the 1 - 2 alpha s/m interval (90% for one test)
  inside the margin (1/(1+m), 1+m): Bonferroni
  over the family, so a false "equivalent" anywhere in it is at most alpha; never on fewer than
  MIN_EQUIVALENT blocks or while a block dominates;
- *inconclusive: could detect >= x%*: neither; x is the minimum detectable effect (MDE),
  the difference this test would call with 80% power at the noise it measured.

Correction over a family (the primary verdicts of a study; exploratory ones and the A/A
control's are families of their own): Holm's step-down (family-wise error; scipy has no
Holm) or Benjamini-Hochberg (false-discovery rate, scipy.stats.false_discovery_control).
Each interval is then computed at the level its test was judged at, so the interval and
the corrected verdict never disagree: under Holm the i-th smallest p is judged at
alpha/(m-i+1) up to the first it keeps (the rest at that one's level); under BH every test
at k*alpha/m, k the number rejected (alpha/m when none: Benjamini & Yekutieli's 2005
false-coverage-rate intervals). These are per-comparison intervals, not a simultaneous set.
A sequential study that may stop at any of L planned looks spends alpha x k_j / (k_1 + ... + k_L)
at the look after k_j blocks (analysis/looks.py: weighted Bonferroni over the looks, the shares
summing to 1), so stopping when it knows keeps the error rate; a study whose records were extended
after a printed verdict spends alpha/L at each size it was judged at (compare.spent_looks).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
from scipy import optimize
from scipy import stats as sps

N_BOOT = 10_000
MAX_EXACT = 20_000
POWER = 0.8
CORRECTIONS = ("holm", "bh", "none")
CORRECTION_NAMES = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no correction"}
MARGIN = 0.02     # the equivalence margin when none is declared: "same speed" means within +-2%
DETECT = 0.10     # the difference a study must be able to call when none is declared


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(0 if seed is None else seed)  # fixed: a report is reproducible


def bootstrap_median(x: Sequence[float], conf: float = 0.95, n_boot: int = N_BOOT, seed: int | None = None) -> tuple[float, float, float]:
    """(median, lo, hi): percentile bootstrap interval of the median (charts' error bars, not verdicts)."""
    a = np.asarray(x, dtype=float)
    if a.size == 0:
        return (math.nan,) * 3
    med = float(np.median(a))
    if a.size == 1 or np.all(a == a[0]):
        return med, med, med
    # percentile, not BCa: BCa's jackknife is undefined for the few, often tied, trials of a benchmark
    res = sps.bootstrap((a,), lambda s, axis: np.median(s, axis=axis), n_resamples=n_boot, confidence_level=conf,
                        method="percentile", vectorized=True, rng=_rng(seed))
    return med, float(res.confidence_interval.low), float(res.confidence_interval.high)


# -- the blocked path ---------------------------------------------------------------------------

def paired_t(d: Sequence[float], conf: float = 0.95, floor: float = 0.0) -> tuple[float, float, float, float]:
    """(mean d, lo, hi, two-sided p) of the paired t-test on the block log-ratios d; the
    interval is the test's own t-interval at `conf`. `floor`: the smallest sd the values'
    recorded resolution allows (resolution_sd): block log-ratios of values printed to 0.01
    are often all equal, and that is rounding, not certainty, so the sd is never taken below
    it. No spread and no known resolution: nothing can be said (NaN), never "exact"."""
    a = np.asarray(d, dtype=float)
    m = float(a.mean()) if a.size else math.nan
    if a.size < 2:
        return m, math.nan, math.nan, math.nan
    sd = float(np.std(a, ddof=1))
    if max(sd, floor) <= 1e-12 * max(1.0, abs(m)):
        return m, math.nan, math.nan, math.nan
    if sd >= floor:
        res = sps.ttest_1samp(a, 0.0)
        ci = res.confidence_interval(conf)
        return m, float(ci.low), float(ci.high), float(res.pvalue)
    # the floor binds: the same t-test with the resolution's sd in place of the sample's
    se, df = floor / math.sqrt(a.size), a.size - 1
    half = float(sps.t.ppf(1 - (1 - conf) / 2, df)) * se
    return m, m - half, m + half, float(2 * sps.t.sf(abs(m) / se, df))


def resolution(values: Sequence[float]) -> float:
    """The coarsest step 10^e (e <= 0) every value lies on: 0.01 for nccl-tests' busbw as it
    prints it, 1 for counts; 0 when none down to 1e-9 (a value kept at full precision)."""
    a = np.abs(np.asarray(values, dtype=float))
    a = a[np.isfinite(a)]
    if a.size == 0:
        return 0.0
    for e in range(0, -10, -1):
        r = a / 10.0 ** e
        if np.all(np.abs(r - np.round(r)) <= 1e-6):
            return 10.0 ** e
    return 0.0


def resolution_sd(step: float, values: Sequence[float], per_block: float = 1.0) -> float:
    """The sd a log-ratio of values recorded to `step` has from rounding alone: each value's
    rounding error is uniform over one step (variance step^2/12), (step/x)^2/12 on the log
    scale; a log-ratio adds the two sides' (each a mean of `per_block` runs). 0 without a step."""
    a = np.asarray(values, dtype=float)
    a = a[a > 0]
    if not step > 0 or a.size == 0:
        return 0.0
    return math.sqrt(float(np.mean((step / a) ** 2)) / 12 / per_block)


def sign_flip_p(d: Sequence[float], seed: int | None = None) -> float:
    """Two-sided p of mean(d) against its 2^k sign flips: every flip enumerated up to 14 blocks
    (the distribution is symmetric, so two-sided is P(|sum| >= |observed|)), else 20,000
    seeded flips through scipy.stats.permutation_test."""
    a = np.asarray(d, dtype=float)
    if a.size == 0:
        return math.nan
    if np.all(a == 0):
        return 1.0
    if a.size <= 14:
        sums = np.abs(_SIGNS(a.size) @ a)
        return float(np.mean(sums >= abs(a.sum()) * (1 - 1e-9) - 1e-15))
    res = sps.permutation_test((a,), lambda s, axis: np.mean(s, axis=axis), permutation_type="samples",
                               vectorized=True, n_resamples=MAX_EXACT, alternative="two-sided", rng=_rng(seed))
    return float(res.pvalue)


def _signs(k: int) -> np.ndarray:
    return 1 - 2 * ((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1)  # (2^k, k) of +-1


_SIGNS = functools.lru_cache(maxsize=None)(_signs)


def blocked_ratio(d: Sequence[float], conf: float = 0.95) -> tuple[float, float, float]:
    """(exp(mean d), lo, hi): geometric-mean ratio of the per-block log-ratios d with its t-interval."""
    m, lo, hi, _ = paired_t(d, conf)
    if math.isnan(lo):
        return math.exp(m), math.exp(m), math.exp(m)
    return math.exp(m), math.exp(lo), math.exp(hi)


def t_mde(blocks: int, sd: float, level: float, power: float = POWER) -> float:
    """Smallest |mean log-ratio| the two-sided paired t-test at `level` calls with `power`, over
    `blocks` blocks whose log-ratios have spread `sd` (exact, by the noncentral t); inf when
    fewer than 2 blocks. Returned in log units."""
    if blocks < 2 or not sd > 0:
        return math.inf if blocks < 2 else 0.0
    return _t_mde(sd / math.sqrt(blocks), blocks - 1, level, power)


def _t_mde(se: float, df: float, level: float, power: float = POWER) -> float:
    """Smallest |effect| a two-sided t-test with standard error `se` and `df` degrees of
    freedom calls at `level` with `power` (the noncentral t)."""
    if not se > 0:
        return 0.0
    # the power depends on effect/se alone, so the MDE is se x the MDE at se 1: computed once per
    # (df, level, power), which a simulation's thousands of verdicts share
    return se * _unit_mde(float(df), float(level), float(power))


@functools.lru_cache(maxsize=4096)
def _unit_mde(df: float, level: float, power: float) -> float:
    se = 1.0
    tc = sps.t.ppf(1 - level / 2, df)

    def short(delta: float) -> float:
        nc = delta / se
        got = sps.nct.sf(tc, df, nc) + sps.nct.cdf(-tc, df, nc)
        return (1.0 if math.isnan(got) else got) - power  # scipy's nct gives NaN far in its tail, where power is 1

    # bracketed around the normal approximation (tc + t_power) x se, so brentq needs few of the
    # noncentral t's slow evaluations: a verdict computes one MDE, a simulation thousands
    guess = (tc + sps.t.ppf(power, df)) * se
    lo, hi = 0.7 * guess, 1.5 * guess
    while short(hi) < 0:
        lo, hi = hi, hi * 2
    while lo > 0 and short(lo) > 0:
        lo, hi = lo / 2, lo
    return float(optimize.brentq(short, lo, hi, xtol=1e-7 * se))


# -- one or two blocks that dominate: the robust check ------------------------------------------

FLAG_RATE = 0.02   # how often a block is flagged in clean (normal) data: the rule's own false alarms


@functools.lru_cache(maxsize=None)
def outlier_cut(k: int) -> float:
    """How many robust sds (1.4826 x MAD) the farthest of k normal block log-ratios lies from
    their median in all but FLAG_RATE of studies (a seeded simulation, 20,000 studies). A fixed
    3.5 MADs flags 12-20% of clean studies at 5-16 blocks: the median and MAD of a few blocks
    are themselves noisy, so the cut must grow as k shrinks."""
    z = np.random.default_rng(k).standard_normal((20_000, k))
    dev = np.abs(z - np.median(z, axis=1, keepdims=True))
    far = dev.max(axis=1) / (1.4826 * np.median(dev, axis=1))
    return float(np.quantile(far, 1 - FLAG_RATE))


def outliers(d: Sequence[float], floor: float = 0.0) -> list[int]:
    """Indices of the block log-ratios farther from their median than outlier_cut(k) robust sds
    (1.4826 x MAD, never below the resolution's `floor`): one slow run in one arm (a noisy
    neighbour) inflates the t-test's sd and moves its mean, while the typical block says
    otherwise. Fewer than 5 blocks: none (the median of 4 says little about a fifth). The rule is
    fixed before the data are seen, and does not depend on which test would reject."""
    a = np.asarray(d, dtype=float)
    if a.size < 5:
        return []
    dev = np.abs(a - float(np.median(a)))
    scale = max(1.4826 * float(np.median(dev)), floor)
    if not scale > 1e-12:
        return []
    return [int(i) for i in np.flatnonzero(dev > outlier_cut(a.size) * scale)]


@functools.lru_cache(maxsize=None)
def _signed_rank_cdf(k: int) -> np.ndarray:
    """P(T+ <= t), t = 0 .. k(k+1)/2: the exact null distribution of the signed-rank statistic."""
    counts = np.zeros(k * (k + 1) // 2 + 1)
    counts[0] = 1.0
    for i in range(1, k + 1):
        nxt = counts.copy()
        nxt[i:] += counts[:-i]
        counts = nxt
    return np.cumsum(counts) / 2.0 ** k


def signed_rank(d: Sequence[float], conf: float = 0.95) -> tuple[float, float, float, float]:
    """(Hodges-Lehmann estimate, lo, hi, two-sided p) of the Wilcoxon signed-rank test on d:
    the median of the k(k+1)/2 Walsh averages (d_i + d_j)/2, and the interval between the
    c-th smallest and c-th largest of them, c from the exact null distribution. The statistic
    is the count of positive Walsh averages (T+ when nothing is tied at 0), so the interval
    excludes 0 exactly when p < 1 - conf. A far block counts as one rank, not as its size."""
    a = np.asarray(d, dtype=float)
    k = a.size
    if k < 2:
        return (float(a.mean()) if k else math.nan), math.nan, math.nan, math.nan
    i, j = np.triu_indices(k)
    w = np.sort((a[i] + a[j]) / 2)
    n = w.size
    cdf = _signed_rank_cdf(k)
    t = float(np.sum(w > 0) + 0.5 * np.sum(w == 0))
    lower = cdf[int(math.floor(t))]
    upper = 1.0 - (cdf[int(math.ceil(t)) - 1] if math.ceil(t) >= 1 else 0.0)
    p = float(min(1.0, 2 * min(lower, upper)))
    c = int(np.searchsorted(cdf, (1 - conf) / 2 * (1 + 1e-12), side="right"))  # t < c is rejected
    lo, hi = (float(w[c - 1]), float(w[n - c])) if c >= 1 else (-math.inf, math.inf)
    return float(np.median(w)), lo, hi, p


def robust_sd(d: Sequence[float], floor: float = 0.0) -> float:
    """The spread of the typical block: 1.4826 x MAD of d (never below the resolution's floor)."""
    return max(float(sps.median_abs_deviation(np.asarray(d, dtype=float), scale="normal")), floor)


# -- the loose-runs path ------------------------------------------------------------------------

def welch(lx: Sequence[float], ly: Sequence[float], conf: float = 0.95,
          floor: float = 0.0) -> tuple[float, float, float, float, float, float]:
    """(mean lx - mean ly, lo, hi, two-sided p, df, se) of Welch's t-test on log values with its
    own interval (scipy.stats.ttest_ind, equal_var=False): valid when the arms' counts and
    spreads differ, where a rank test is not a test of location. `floor`: the smallest standard
    error the values' resolution allows (then the df of the smaller arm, conservatively). No
    spread and no known resolution: NaN (untested)."""
    x, y = np.asarray(lx, dtype=float), np.asarray(ly, dtype=float)
    diff = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return diff, math.nan, math.nan, math.nan, math.nan, math.nan
    vx, vy = float(np.var(x, ddof=1)) / x.size, float(np.var(y, ddof=1)) / y.size
    se = math.sqrt(vx + vy)
    if max(se, floor) <= 1e-12 * max(1.0, abs(diff)):
        return diff, math.nan, math.nan, math.nan, math.nan, math.nan
    if se >= floor:
        res = sps.ttest_ind(x, y, equal_var=False)
        ci = res.confidence_interval(conf)
        return diff, float(ci.low), float(ci.high), float(res.pvalue), float(res.df), se
    df = min(x.size, y.size) - 1
    half = float(sps.t.ppf(1 - (1 - conf) / 2, df)) * floor
    return diff, diff - half, diff + half, float(2 * sps.t.sf(abs(diff) / floor, df)), float(df), floor


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


def hodges_lehmann(lx: Sequence[float], ly: Sequence[float], conf: float = 0.95) -> tuple[float, float, float]:
    """(shift, lo, hi) of lx against ly: the median of every difference lx_i - ly_j, and every
    shift s the two-sided exact Mann-Whitney test of (lx - s, ly) keeps at 1 - conf. The test's
    p only changes where s crosses a pairwise difference, so it is evaluated once between each
    two; the interval is the span of the kept gaps, closed at the differences that bound it."""
    x, y = np.asarray(lx, dtype=float), np.asarray(ly, dtype=float)
    diffs = np.unique(np.subtract.outer(x, y).ravel())
    shift = float(np.median(np.subtract.outer(x, y)))
    if diffs.size == 1:
        return shift, shift, shift
    if rank_floor(x.size, y.size) > 1 - conf:  # even full separation is kept: so is every shift
        return shift, -math.inf, math.inf
    mids = (diffs[:-1] + diffs[1:]) / 2
    method = "exact" if x.size * y.size <= 400 else "asymptotic"

    def kept(i: int) -> bool:
        return sps.mannwhitneyu(x - mids[i], y, alternative="two-sided", method=method).pvalue > 1 - conf

    # p rises as the shift nears the estimate and falls past it: the kept shifts are one run of
    # gaps around the estimate, so each end is found by bisection (a dozen tests, not N)
    centre = int(np.clip(np.searchsorted(mids, shift), 0, mids.size - 1))
    if not kept(centre):
        return shift, shift, shift  # no shift is kept between two differences: the estimate's own gap
    lo_i, hi_i = 0, centre  # the first kept gap lies in [lo_i, hi_i]
    while lo_i < hi_i:
        mid = (lo_i + hi_i) // 2
        lo_i, hi_i = (lo_i, mid) if kept(mid) else (mid + 1, hi_i)
    first = lo_i
    lo_i, hi_i = centre, mids.size - 1  # the last kept gap
    while lo_i < hi_i:
        mid = (lo_i + hi_i + 1) // 2
        lo_i, hi_i = (mid, hi_i) if kept(mid) else (lo_i, mid - 1)
    return shift, float(diffs[first]), float(diffs[lo_i + 1])


def rank_floor(n: int, n_base: int) -> float:
    """The smallest two-sided p the exact rank test can reach: the groups fully separated."""
    return min(1.0, 2 / math.comb(n + n_base, n))


def rank_mde(n: int, n_base: int, sd: float, level: float, power: float = POWER) -> float:
    """About the MDE (log units) of the rank test: inf when its floor is not below `level`; else
    the two-sample t's, the sd inflated by sqrt(pi/3) (the rank test's efficiency against t is
    3/pi under normal noise). An approximation that understates at few runs (power 65% at the
    printed MDE with 4 vs 4); no verdict uses it since loose runs are judged by Welch's t."""
    if n < 2 or n_base < 2 or rank_floor(n, n_base) >= level:
        return math.inf
    df = n + n_base - 2
    se = sd * math.sqrt(math.pi / 3) * math.sqrt(1 / n + 1 / n_base)
    return float((sps.t.ppf(1 - level / 2, df) + sps.t.ppf(power, df)) * se)


# -- planning -----------------------------------------------------------------------------------

def plan_mde(blocks: int, tests: int, cv: float, alpha: float = 0.05, looks: int = 1) -> float:
    """The difference (a fraction: 0.05 = 5%) one real effect among `tests` primary tests is
    called with 80% power over `blocks` blocks, when each run's metric varies by `cv` (the sd of
    its log) and runs are independent: sd(d) = cv * sqrt(2); judged at alpha / (tests * looks)
    (`looks`: 1 / the look's share of alpha in a sequential study, analysis/looks.py),
    the level Holm gives the one real effect when it is the only one (Bonferroni's)."""
    d = t_mde(blocks, cv * math.sqrt(2), alpha / (max(tests, 1) * max(looks, 1)))
    return math.expm1(d) if math.isfinite(d) else math.inf


def blocks_for(detect: float, tests: int, cv: float, alpha: float = 0.05, looks: int = 1, most: int = 200) -> int | None:
    """The fewest blocks (>= 3) whose plan_mde is at most `detect`; None past `most`."""
    for k in range(3, most + 1):
        if plan_mde(k, tests, cv, alpha, looks) <= detect:
            return k
    return None


# -- corrections --------------------------------------------------------------------------------

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


def levels(p: Sequence[float], method: str, alpha: float) -> np.ndarray:
    """The level each test of the family is judged at (the interval's 1 - confidence), so
    that 'the interval excludes 1' is the same statement as 'the corrected p < alpha'."""
    a = np.asarray(p, dtype=float)
    m = a.size
    if m == 0 or method == "none":
        return np.full(m, alpha)
    if method == "bh":
        rejected = int(np.sum(adjust(a, "bh") < alpha))
        return np.full(m, alpha * max(rejected, 1) / m)
    order = np.argsort(a, kind="mergesort")
    out = np.empty(m)
    level = alpha / m
    for i, j in enumerate(order):
        level = alpha / (m - i)
        out[j] = level
        if a[j] >= level:  # Holm stops here: this test and every later one are judged at this level
            out[order[i:]] = level
            break
    return out


# -- one verdict --------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One arm against the baseline at one point, on one metric (30-odd fields: built by keyword only)."""

    metric: str
    arm: str              # the arm's label (record["study"]["arm"], else the fabric's name)
    baseline: str
    n: int
    n_base: int
    median: float
    median_base: float
    ratio: float          # arm / baseline in the metric's own units (geometric mean: of block ratios, or of runs)
    lo: float             # the ratio's interval, at confidence `conf`
    hi: float
    p: float              # the deciding test's p: paired t (or, robust, signed-rank) on block log-ratios; Welch t
    speedup: float        # >1: the arm is ahead (ratio, inverted for lower-is-better metrics)
    speedup_lo: float
    speedup_hi: float
    significant: bool
    verdict: str
    word: str = "faster"
    design: str = "Welch t on log values, run order not recorded"
    blocks: int = 0       # blocks paired (blocked test); 0 for loose runs
    p_adj: float = math.nan   # corrected over the family; NaN when not tested
    correction: str = "holm"
    family: int = 1       # tests in the correction's family
    control: bool = False     # the arm is the study's A/A control (a duplicate of the baseline)
    alpha: float = 0.05
    floor: float = math.nan   # blocked: the smallest p the exact sign-flip test can give (NaN: not tested)
    conf: float = 0.95        # the interval's confidence: 1 - the level the test was judged at
    p_exact: float = math.nan  # the exact check printed beside: sign-flip (blocked), Mann-Whitney (loose runs)
    sd: float = math.nan      # spread of the data in log units: sd of d (blocked), pooled sd of logs (loose)
    mde: float = math.nan     # fraction this test calls with 80% power at its level and measured sd
    margin: float = MARGIN    # equivalence margin (a fraction)
    detect: float = DETECT    # the difference the study was sized to call (a fraction)
    primary: bool = True      # a decision (False: exploratory, a family of its own)
    looks: int = 1            # looks of a sequential or extended study (alpha is spent over them)
    share: float = math.nan   # the fraction of alpha this look spends (analysis/looks.py); NaN: 1/looks
    higher_is_better: bool = True
    data: tuple = field(default=(), repr=False, compare=False)       # blocked: d; loose: log values of the arm
    data_base: tuple = field(default=(), repr=False, compare=False)  # loose: log values of the baseline
    floor_sd: float = 0.0     # the values' resolution as a floor: on sd(d) (blocked), on the se (loose)
    robust: str = ""          # why the signed-rank test decides (blocks that dominate); "" when the t-test does
    p_t: float = math.nan     # the t-test's p, printed beside when the robust test decides
    eq_lo: float = math.nan   # the equivalence (TOST) interval of the speedup, at eq_conf
    eq_hi: float = math.nan
    eq_conf: float = math.nan  # 1 - 2 alpha x spent / tests: TOST per claim at alpha x spent / tests
    why: str = ""             # why it was not tested, when it was not
    # the data are the blocks' raw differences, arm - baseline in the metric's own units (a count
    # or share that can be 0 has no log-ratio): ratio, lo, hi and mde are then that difference,
    # speedup the arm's lead in it; no equivalence or `detect` (both are relative) is claimed
    raw: bool = False

    @property
    def fabric(self) -> str:
        """The arm, by its name before `arm` (kept for a release)."""
        return self.arm

    @property
    def tested(self) -> bool:
        return not math.isnan(self.p)

    @property
    def spent(self) -> float:
        """The fraction of alpha this verdict's look spends: its planned share, else 1/looks."""
        return self.share if self.share > 0 else 1 / max(self.looks, 1)

    @property
    def equivalent(self) -> bool:
        """Two one-sided tests at alpha x spent/tests each (the TOST interval at 1 - 2 alpha spent/m,
        90% for one test) lie inside the margin: Bonferroni over the family, so a false
        "equivalent" anywhere in it is at most alpha. Never while a block dominates (robust), and
        never on fewer than MIN_EQUIVALENT runs per arm: a slowdown that hits one arm's runs
        rarely is absent from few of them (from 6 with probability 0.9^6 = 53% at 1 in 10)."""
        return (self.tested and not self.robust and min(self.blocks or min(self.n, self.n_base), self.n, self.n_base)
                >= MIN_EQUIVALENT and 1 / (1 + self.margin) < self.eq_lo and self.eq_hi < 1 + self.margin)

    @property
    def rules_out(self) -> bool:
        """The interval excludes a difference of `detect` or more either way: the question the
        study was sized for is answered 'no' even when equivalence at the margin is not."""
        return self.tested and not self.raw and 1 / (1 + self.detect) < self.speedup_lo and self.speedup_hi < 1 + self.detect

    @property
    def outcome(self) -> str:
        """differs | equivalent | inconclusive | untested: the three words and the fourth case."""
        if not self.tested:
            return "untested"
        return "differs" if self.significant else "equivalent" if self.equivalent else "inconclusive"

    @property
    def can_call(self) -> bool:
        """Whether any difference at all could be called: the test has power somewhere."""
        return self.tested and math.isfinite(self.mde)

    @property
    def bias_bound(self) -> float:
        """The largest difference (a fraction) the interval allows, either way."""
        return max(self.speedup_hi - 1, 1 / self.speedup_lo - 1) if self.speedup_lo > 0 and not self.raw else math.inf

    @property
    def says(self) -> str:
        """The word of the sentence: a lower-is-better metric is "lower" (its own change, ratio - 1,
        never a speed above 100%); a rate keeps its word, "faster" or "better"."""
        return self.word if self.higher_is_better else "lower"


MIN_EQUIVALENT = 8   # blocks (or runs per arm) before "equivalent" may be said: see Comparison.equivalent


def _interval(c: Comparison, conf: float, with_mde: bool = True) -> tuple[float, float, float, float]:
    """(lo, hi, p, mde as a fraction; NaN unless `with_mde`: the noncentral t is the slow part) of
    c's data at `conf`."""
    level = 1 - conf
    if c.blocks and c.raw:  # the same tests on differences in the metric's units: nothing to exp
        if c.robust:
            _, lo, hi, p = signed_rank(c.data, conf)
            mde = t_mde(c.blocks, robust_sd(c.data) * math.sqrt(math.pi / 3), level) if with_mde else math.nan
        else:
            _, lo, hi, p = paired_t(c.data, conf)
            mde = t_mde(c.blocks, c.sd, level) if with_mde else math.nan
        return (math.nan, math.nan, math.nan, math.inf) if math.isnan(lo) else (lo, hi, p, mde)
    if c.blocks:
        if c.robust:
            _, lo, hi, p = signed_rank(c.data, conf)
            # the signed-rank test's efficiency against t is 3/pi under normal noise: an "about" MDE
            mde = t_mde(c.blocks, robust_sd(c.data, c.floor_sd) * math.sqrt(math.pi / 3), level) if with_mde else math.nan
        else:
            _, lo, hi, p = paired_t(c.data, conf, c.floor_sd)
            mde = t_mde(c.blocks, max(c.sd, c.floor_sd), level) if with_mde else math.nan
        if math.isnan(lo):
            return math.nan, math.nan, math.nan, math.inf
        return math.exp(lo), math.exp(hi), p, math.expm1(mde) if math.isfinite(mde) else mde
    _, lo, hi, p, df, se = welch(c.data, c.data_base, conf, c.floor_sd)
    if math.isnan(lo):
        return math.nan, math.nan, math.nan, math.inf
    return math.exp(lo), math.exp(hi), p, math.expm1(_t_mde(se, df, level)) if with_mde else math.nan


@dataclass(frozen=True)
class Design:
    """How an arm's values were taken against the baseline's. `blocks`: the per-block
    log-ratios of a blocked design (then the paired t-test, or the signed-rank test when a
    block dominates; `name` names the design); None: Welch's t on log values. `step`: the
    values' recorded resolution (resolution()), a floor on the spread. `raw`: `blocks` are the
    blocks' raw differences (arm - baseline, the metric's units), for a count or share that can
    be 0: judged by the same tests, stated as a difference per run."""

    blocks: Sequence[float] | None = None
    name: str | None = None
    step: float = 0.0
    raw: bool = False


@dataclass(frozen=True)
class Judging:
    """How a comparison is judged: its level, the verdict's word ("faster" for times and rates,
    "better" for the rest: comm share, loss, failures), whether it is the A/A control or a
    primary verdict, the equivalence margin, the looks of a sequential study and the share of
    alpha this look spends (analysis/looks.py), the difference the study must be able to call,
    and the permutation test's seed; whether the metric is better higher (a rate) or lower (a time)."""

    alpha: float = 0.05
    seed: int | None = None
    word: str = "faster"
    control: bool = False
    margin: float = MARGIN
    primary: bool = True
    looks: int = 1
    detect: float = DETECT
    share: float = math.nan
    higher_is_better: bool = True


def compare(values: Sequence[float], base: Sequence[float], arm: str, baseline: str, metric: str,
            design: Design = Design(), judging: Judging = Judging()) -> Comparison:
    """`arm` against `baseline` on one metric's per-trial values, as a family of one test
    (`correct` re-judges it once the whole family is known)."""
    blocks, step, raw = design.blocks, design.step, design.raw
    j = judging
    alpha, seed, word, control, margin, primary, looks = j.alpha, j.seed, j.word, j.control, j.margin, j.primary, j.looks
    x, y = [float(v) for v in values], [float(v) for v in base]
    med, med_base = float(np.median(x)), float(np.median(y))
    if blocks is not None:
        d = tuple(float(v) for v in blocks)
        k = len(d)
        # no complete block (every pair lost a side): the medians' ratio is shown, not tested
        ratio = (float(np.mean(d)) if d else med - med_base) if raw else math.exp(float(np.mean(d))) if d else med / med_base
        fl = 0.0 if raw else math.hypot(resolution_sd(step, x, len(x) / k), resolution_sd(step, y, len(y) / k)) if k else 0.0
        far = outliers(d, fl)
        robust = "" if not far else (
            f"{len(far)} of {k} block {'differences' if raw else 'log-ratios'} lie more than {outlier_cut(k):.1f} robust "
            f"sds from their median ({', '.join(_amount(raw, d[i]) for i in far)} against {_amount(raw, float(np.median(d)))}): "
            f"decided by the signed-rank test, which counts a block as one rank, not by its size")
        p_t = paired_t(d, floor=fl)[3] if k >= 2 else math.nan
        p = signed_rank(d)[3] if robust else p_t
        sd = float(np.std(d, ddof=1)) if k >= 2 else math.nan
        floor = min(1.0, 2 / 2 ** k)  # the sign-flip test: all blocks one way is 1 of 2^k flips per tail
        why = "" if not math.isnan(p) else "need >= 2 blocks" if k < 2 else \
            ("every block's difference is the same" if raw else
             "every block log-ratio is the same and the values carry no resolution to bound their spread")
        c = Comparison(metric=metric, arm=arm, baseline=baseline, n=len(x), n_base=len(y), median=med,
                       median_base=med_base, ratio=ratio, lo=ratio, hi=ratio, p=p, speedup=1, speedup_lo=1,
                       speedup_hi=1, significant=False, verdict="", word=word, design=design.name or "blocked",
                       blocks=k, p_adj=p, control=control, alpha=alpha, floor=floor,
                       p_exact=sign_flip_p(d, seed) if k >= 2 else math.nan, sd=sd, margin=margin, primary=primary,
                       looks=looks, data=d, floor_sd=fl, robust=robust, p_t=p_t, why=why, raw=raw)
    else:
        pos = all(v > 0 for v in x + y)
        lx, ly = (tuple(np.log(x)), tuple(np.log(y))) if pos else (tuple(x), tuple(y))
        # a value <= 0 has no log: the ratio of medians is shown, not tested
        ratio = math.exp(float(np.mean(lx) - np.mean(ly))) if pos else \
            med / med_base if med_base else 1.0 if med == 0 else math.inf
        fl = math.hypot(resolution_sd(step, x, len(x)), resolution_sd(step, y, len(y))) if pos else 0.0
        p = welch(lx, ly, floor=fl)[3] if len(x) >= 2 and len(y) >= 2 and pos else math.nan
        sd = math.sqrt(((len(lx) - 1) * np.var(lx, ddof=1) + (len(ly) - 1) * np.var(ly, ddof=1)) / (len(lx) + len(ly) - 2)) \
            if len(lx) >= 2 and len(ly) >= 2 else math.nan
        why = "" if not math.isnan(p) else "need >= 2 runs each" if len(x) < 2 or len(y) < 2 else \
            "a value <= 0 has no ratio to test (differences of counts are not judged)" if not pos else "every run of both arms is the same and the values " \
            "carry no resolution to bound their spread"
        c = Comparison(metric=metric, arm=arm, baseline=baseline, n=len(x), n_base=len(y), median=med,
                       median_base=med_base, ratio=ratio, lo=ratio, hi=ratio, p=p, speedup=1, speedup_lo=1,
                       speedup_hi=1, significant=False, verdict="", word=word, design=design.name or Comparison.design,
                       blocks=0, p_adj=p, control=control, alpha=alpha,
                       p_exact=permutation_p(x, y, seed=seed) if not math.isnan(p) else math.nan, sd=sd,
                       margin=margin, primary=primary, looks=looks, data=lx, data_base=ly, floor_sd=fl, why=why)
    c = replace(c, higher_is_better=j.higher_is_better, detect=j.detect, share=j.share)
    return correct([c], "holm", alpha)[0]


def _judge(c: Comparison, conf: float, p_adj: float, method: str, m: int, alpha: float) -> Comparison:
    eq_conf = 1 - 2 * alpha * c.spent / max(m, 1)
    if c.tested:
        lo, hi, _, mde = _interval(c, conf)
        elo, ehi = _interval(c, eq_conf, with_mde=False)[:2] if not (c.robust or c.raw) else (math.nan, math.nan)
    else:
        lo = hi = c.ratio
        elo = ehi = math.nan
        mde = math.inf
    if c.raw:  # a difference: the arm's lead is the difference, negated where lower is better
        s, slo, shi = (c.ratio, lo, hi) if c.higher_is_better else (-c.ratio, -hi, -lo)
        elo = ehi = math.nan
    else:
        s, slo, shi = (c.ratio, lo, hi) if c.higher_is_better else (1 / c.ratio, _inv(hi), _inv(lo))
    eslo, eshi = (elo, ehi) if c.higher_is_better else (_inv(ehi), _inv(elo))
    c = replace(c, lo=lo, hi=hi, speedup=s, speedup_lo=slo, speedup_hi=shi, p_adj=p_adj, correction=method,
                family=m, alpha=alpha, conf=conf, mde=mde, eq_lo=eslo, eq_hi=eshi, eq_conf=eq_conf)
    one = 0.0 if c.raw else 1.0
    sig = bool(c.tested and p_adj < alpha and (slo > one or shi < one))
    c = replace(c, significant=sig)
    return replace(c, verdict=verdict(c))


def correct(family: Sequence[Comparison], method: str = "holm", alpha: float = 0.05) -> list[Comparison]:
    """The family's comparisons with corrected p, intervals at the level each was judged at,
    and verdicts; untested ones (too few trials) are not counted as tests. A sequential or
    extended family (looks > 1) spends its look's share of alpha (Comparison.spent)."""
    tested = [i for i, c in enumerate(family) if c.tested]
    looks = max([c.looks for c in family] or [1])
    spent = min([c.spent for c in family] or [1.0])
    share = spent if any(c.share > 0 for c in family) else math.nan
    a = alpha * spent
    ps = [family[i].p for i in tested]
    padj = np.minimum(1.0, adjust(ps, method) / spent)
    lev = levels(ps, method, a)
    out = list(family)
    for k, i in enumerate(tested):
        out[i] = _judge(replace(family[i], looks=looks, share=share), 1 - lev[k], float(padj[k]), method, len(tested), alpha)
    for i, c in enumerate(out):
        if i not in tested:
            out[i] = _judge(replace(c, looks=looks, share=share), 1 - a, math.nan, method, len(tested), alpha)
    return out


def method_note(c: Comparison) -> str:
    """'interleaved ABBA, 6 blocks, Holm over 18 tests'"""
    corr = "no correction" if c.correction == "none" else \
        f"{CORRECTION_NAMES[c.correction]} over {c.family} {'primary' if c.primary else 'exploratory'} " \
        f"test{'s' if c.family != 1 else ''}"
    seq = f", sequential: alpha spent over {c.looks} looks" if c.looks > 1 else ""
    if c.looks > 1 and c.share > 0:
        seq += f" in proportion to their blocks ({100 * c.share:.3g}% of it at this look)"
    return f"{c.design}, {corr}{seq}"


def edge(c: Comparison) -> tuple[str, str, float, float, float]:
    """(leader, trailer, fraction, lo, hi): the side ahead, by how much, and that fraction's
    interval. A rate: the leader's value over the trailer's, minus 1 (0.299 = 29.9% faster). A
    lower-is-better metric: 1 minus the leader's value over the trailer's (0.497 = 49.7% lower),
    its own change, so a halved latency is "50% lower", never "100% faster". The one way a ratio
    is put into words: the verdict sentence, the report's tables and its headlines all use it."""
    s, slo, shi = c.speedup, c.speedup_lo, c.speedup_hi
    if c.raw:  # the lead in the metric's own units: the arm's when >= 0
        return (c.arm, c.baseline, s, slo, shi) if s >= 0 else (c.baseline, c.arm, -s, -shi, -slo)
    if c.higher_is_better:
        if s >= 1:
            return c.arm, c.baseline, s - 1, slo - 1, shi - 1
        return c.baseline, c.arm, 1 / s - 1, _inv(shi) - 1, _inv(slo) - 1
    # speedup = baseline / arm: the arm's value is 1/s of the baseline's
    if s >= 1:
        return c.arm, c.baseline, 1 - 1 / s, 1 - _inv(slo), 1 - _inv(shi)
    return c.baseline, c.arm, 1 - s, 1 - shi, 1 - slo


def _inv(x: float) -> float:
    return math.inf if x == 0 else 1 / x  # an unbounded interval stays unbounded


def pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def gap(c: Comparison, lead: str, trail: str, frac: float, verb: str = " is") -> str:
    """'b is faster than a by 20.0%', or for a lower-is-better metric 'b's median_ttft_ms is
    49.7% lower than a's' (verb "" for the short form of the equivalent and inconclusive lines);
    a raw difference 'b's tcp_retransmits is 1.25 lower than a's per run'."""
    if c.raw:
        return f"{lead}'s {c.metric}{verb} {frac:.3g} {'higher' if c.higher_is_better else 'lower'} than {trail}'s per run"
    if c.higher_is_better:
        return f"{lead}{verb} {c.says} than {trail} by {pct(frac)}"
    return f"{lead}'s {c.metric}{verb} {pct(frac)} lower than {trail}'s"


def _tail(c: Comparison) -> str:
    if c.robust:
        p = f"signed-rank p={c.p:.3g}, paired t p={c.p_t:.3g}"
    else:
        p = f"paired t p={c.p:.3g}" if c.blocks else f"Welch t p={c.p:.3g}"
    corrected = "" if c.correction == "none" and c.looks == 1 else f", corrected p={c.p_adj:.3g}"
    exact = "" if math.isnan(c.p_exact) else f", sign-flip p={c.p_exact:.3g}" if c.blocks else \
        f", rank test p={c.p_exact:.3g}"
    n = "" if c.blocks else f"n={c.n} vs {c.n_base}; "  # a blocked design names its blocks
    # Holm's and BH's levels make each interval agree with its own test; they are not a
    # simultaneous set, so say per comparison when the level is not the plain 1 - alpha
    level = f"{100 * c.conf:.4g}% CI" + ("" if c.family <= 1 and c.looks == 1 else ", per comparison")
    robust = f"; {c.robust}" if c.robust else ""
    return f"({level}; {p}{corrected}{exact}; {n}{method_note(c)}{robust})"


def _amount(raw: bool, x: float) -> str:
    """A block's difference in words: '+1.25' (raw, the metric's units) or '+3.0%' (a log-ratio)."""
    return f"{x:+.3g}" if raw else f"{100 * math.expm1(x):+.1f}%"


def _fmt(lo: float, hi: float, signed: bool = True, raw: bool = False) -> str:
    if raw:
        ok = math.isfinite(lo) and math.isfinite(hi)
        return "[unbounded]" if not ok else f"[{lo:+.3g}, {hi:+.3g}]" if signed else f"[{lo:.3g}, {hi:.3g}]"
    if not (math.isfinite(hi) and lo > -1 and math.isfinite(lo)):
        return "[unbounded]"
    return f"[{100 * lo:+.1f}, {100 * hi:+.1f}]" if signed else f"[{100 * lo:.1f}, {100 * hi:.1f}]"


def verdict(c: Comparison) -> str:
    """One of three sentences, each naming the side ahead first and the interval of that same
    percentage (negative = the other side is ahead): 'A is faster than B by x% [lo, hi]'
    (a latency: 'A's m is x% lower than B's'), 'equivalent within +-m: ...' or
    'inconclusive: ...; this test could detect >= y%'."""
    lead, trail, frac, flo, fhi = edge(c)
    if not c.tested:
        need = c.why or ("need >= 2 blocks" if c.blocks or "block" in c.design else "need >= 2 runs each")
        return (f"not tested ({c.n} vs {c.n_base} runs{f', {c.blocks} block(s)' if c.blocks else ''}; {need}): "
                f"{gap(c, lead, trail, frac, '')} ({c.design})")
    interval = _fmt(flo, fhi, raw=c.raw)
    if c.significant:
        within = f"; within the +-{pct(c.margin)} equivalence margin" if c.equivalent else ""
        return f"{gap(c, lead, trail, frac)} {_fmt(flo, fhi, False, c.raw)}{within} {_tail(c)}"
    if c.equivalent:
        elo, ehi = edge(replace(c, speedup_lo=c.eq_lo, speedup_hi=c.eq_hi))[3:]
        return (f"equivalent within +-{pct(c.margin)}: {gap(c, lead, trail, frac, '')} {interval}; "
                f"its {100 * c.eq_conf:.4g}% interval {_fmt(elo, ehi)} lies inside the margin "
                f"(two one-sided tests) {_tail(c)}")
    could = f"this test could detect >= {f'{c.mde:.3g} per run' if c.raw else pct(c.mde)}" if math.isfinite(c.mde) else \
        f"this test cannot call any difference (its smallest p is {c.floor:.3g}; more runs are needed)"
    if c.rules_out:
        could = f"it rules out a difference of {pct(c.detect)} or more, not yet equivalent within +-{pct(c.margin)}"
    return f"inconclusive: {gap(c, lead, trail, frac, '')} {interval}; {could} {_tail(c)}"
