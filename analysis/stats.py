"""Statistics over trials: medians with bootstrap intervals, ratios, a permutation test.

A trial is one record (one run of the workload at one point). Per-step samples are not
trials: steps of one run share a process, a placement, NCCL's ring/channel choices and
the network path, so they are correlated; treating them as independent would shrink the
intervals to nothing and call noise significant (pseudo-replication). Each record's
metric is already computed as the records define it (training: mean step time after
`samples.warmup_steps`), and is taken as is.

Significance: a two-sided Mann-Whitney (Wilcoxon rank-sum) test with its exact
permutation distribution (all relabelings enumerated up to 20,000, else 20,000 random
ones; ties get mid-ranks). Why this one: it assumes no distribution (run times are
skewed, not normal, so no t-test), ranks keep one outlier trial from deciding, and it
keeps power at the small trial counts of benchmarks. A permutation test on the median
itself was tried and rejected: the median ignores the extreme trials, so many relabelings
tie with the observed one and 5 vs 5 fully separated trials only reach p = 0.12.
Its floor still matters: with n trials per side the smallest two-sided p is 2/C(2n, n),
so 2 vs 2 trials can never be significant (p >= 0.33), 3 vs 3 reaches 0.1, 4 vs 4 0.029.
A verdict names a winner only when p < alpha AND the ratio's bootstrap interval excludes 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np

N_BOOT = 10_000
MAX_EXACT = 20_000


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(0 if seed is None else seed)  # fixed: a report is reproducible


def bootstrap_median(x: Sequence[float], conf: float = 0.95, n_boot: int = N_BOOT, seed: int | None = None) -> tuple[float, float, float]:
    """(median, lo, hi): percentile bootstrap interval of the median."""
    a = np.asarray(x, dtype=float)
    if a.size == 0:
        return (math.nan,) * 3
    med = float(np.median(a))
    if a.size == 1:
        return med, med, med
    boot = np.median(_rng(seed).choice(a, size=(n_boot, a.size), replace=True), axis=1)
    lo, hi = np.quantile(boot, [(1 - conf) / 2, (1 + conf) / 2])
    return med, float(lo), float(hi)


def bootstrap_ratio(a: Sequence[float], b: Sequence[float], conf: float = 0.95, n_boot: int = N_BOOT,
                    seed: int | None = None) -> tuple[float, float, float]:
    """(median(a)/median(b), lo, hi), each group resampled independently."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ratio = float(np.median(x) / np.median(y))
    if x.size < 2 and y.size < 2:
        return ratio, ratio, ratio
    rng = _rng(seed)
    bx = np.median(rng.choice(x, size=(n_boot, x.size)), axis=1)
    by = np.median(rng.choice(y, size=(n_boot, y.size)), axis=1)
    lo, hi = np.quantile(bx / by, [(1 - conf) / 2, (1 + conf) / 2])
    return ratio, float(lo), float(hi)


def _ranks(a: np.ndarray) -> np.ndarray:
    """1-based ranks with ties averaged (mid-ranks)."""
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(a.size)
    ranks[order] = np.arange(1, a.size + 1)
    for v in np.unique(a):
        tie = a == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def permutation_p(a: Sequence[float], b: Sequence[float], seed: int | None = None) -> float:
    """Two-sided p-value of the Mann-Whitney rank-sum statistic under exchangeability."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0:
        return math.nan
    ranks = _ranks(np.concatenate([x, y]))
    n, total = x.size, ranks.size
    expected = n * (total + 1) / 2
    observed = abs(ranks[:n].sum() - expected)
    eps = 1e-9
    if math.comb(total, n) <= MAX_EXACT:
        idx = np.array(list(combinations(range(total), n)))             # (C, n) every labelling of x
        sums = ranks[idx].sum(axis=1)
        return float(np.mean(np.abs(sums - expected) >= observed - eps))
    rng = _rng(seed)
    sums = np.array([rng.permutation(ranks)[:n].sum() for _ in range(MAX_EXACT)])
    return float((np.sum(np.abs(sums - expected) >= observed - eps) + 1) / (MAX_EXACT + 1))


@dataclass(frozen=True)
class Comparison:
    """One fabric against the baseline at one point, on one metric."""

    metric: str
    fabric: str
    baseline: str
    n: int
    n_base: int
    median: float
    median_base: float
    ratio: float          # median(fabric) / median(baseline), in the metric's own units
    lo: float
    hi: float
    p: float
    speedup: float        # >1: fabric is faster (ratio, inverted for lower-is-better metrics)
    speedup_lo: float
    speedup_hi: float
    significant: bool
    verdict: str


def compare(values: Sequence[float], base: Sequence[float], fabric: str, baseline: str, metric: str,
            higher_is_better: bool = True, alpha: float = 0.05, conf: float = 0.95, seed: int | None = None,
            word: str = "faster") -> Comparison:
    """`fabric` against `baseline` on one metric's per-trial values. `word` names the winner's
    edge: "faster" for times and rates, "better" for the rest (comm share, loss, failures)."""
    x, y = list(values), list(base)
    ratio, lo, hi = bootstrap_ratio(x, y, conf=conf, seed=seed)
    # "faster" in speed terms: throughput ratio, or the inverse ratio of a time/latency
    s, slo, shi = (ratio, lo, hi) if higher_is_better else (1 / ratio, 1 / hi, 1 / lo)
    if len(x) < 2 or len(y) < 2:
        p, sig = math.nan, False
        verdict = (f"insufficient trials ({len(x)} vs {len(y)}; need >= 2 each, >= 4 to detect a difference): "
                   f"{fabric}/{baseline} {'speed ratio' if word == 'faster' else 'ratio (>1: ' + fabric + ' ' + word + ')'} "
                   f"{s:.3f}, not tested")
    else:
        p = permutation_p(x, y, seed=seed)
        sig = bool(p < alpha and (slo > 1 or shi < 1))
        # One convention for every outcome: name the side with the better median first and
        # say by how much, with the interval of that same percentage (a signed "-25.6%"
        # leaves the reader guessing who is behind). Not significant: the same sentence,
        # prefixed, and its interval may cross 0 (negative = the other side is ahead).
        if s >= 1:
            lead, trail, pct, plo, phi, n1, n2 = fabric, baseline, s - 1, slo - 1, shi - 1, len(x), len(y)
        else:
            lead, trail, pct, plo, phi, n1, n2 = baseline, fabric, 1 / s - 1, 1 / shi - 1, 1 / slo - 1, len(y), len(x)
        sign = "" if sig else "+"
        tail = f"[{100 * plo:{sign}.1f}, {100 * phi:{sign}.1f}] (p={p:.3g}, n={n1} vs {n2})"
        if sig:
            verdict = f"{lead} is {word} than {trail} by {100 * pct:.1f}% {tail}"
        elif s == 1:
            verdict = f"not significant: {fabric} and {baseline} have equal medians {tail}"
        else:
            verdict = f"not significant: {lead} is {word} than {trail} by {100 * pct:.1f}% {tail}"
    return Comparison(metric, fabric, baseline, len(x), len(y), float(np.median(x)), float(np.median(y)),
                      ratio, lo, hi, p, s, slo, shi, sig, verdict)
