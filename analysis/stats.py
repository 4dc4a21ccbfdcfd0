"""Statistics over trials: medians with bootstrap intervals, ratios, a permutation test.

A trial is one record (one run of the workload at one point). Per-step samples are not
trials: steps of one run share a process, a placement, NCCL's ring/channel choices and
the network path, so they are correlated; treating them as independent would shrink the
intervals to nothing and call noise significant (pseudo-replication). Each record's
metric is already computed as the records define it (training: mean step time after
`samples.warmup_steps`), and is taken as is.

Significance: a two-sided permutation test on the log ratio of medians, the same
statistic the interval is about. It assumes no distribution (step times are skewed, not
normal), is exact for the small trial counts of benchmarks (all relabelings enumerated up
to 20,000, else 20,000 random ones), and the median keeps one outlier trial from deciding.
Its floor matters: with n trials per side the smallest two-sided p is 2/C(2n, n), so
2 vs 2 trials can never be significant (p >= 0.33), 3 vs 3 reaches 0.1, 4 vs 4 0.029.
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


def _stat(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # log ratio of medians along the last axis; all metrics compared are positive
    return np.log(np.median(x, axis=-1)) - np.log(np.median(y, axis=-1))


def permutation_p(a: Sequence[float], b: Sequence[float], seed: int | None = None) -> float:
    """Two-sided p-value of 'same distribution' for the log ratio of medians."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size == 0 or y.size == 0 or np.any(x <= 0) or np.any(y <= 0):
        return math.nan
    pooled = np.concatenate([x, y])
    n, total = x.size, pooled.size
    observed = abs(float(_stat(x, y)))
    eps = 1e-12 * max(1.0, observed)
    if math.comb(total, n) <= MAX_EXACT:
        idx = np.array(list(combinations(range(total), n)))            # (C, n)
        mask = np.zeros((len(idx), total), dtype=bool)
        mask[np.arange(len(idx))[:, None], idx] = True
        px = pooled[None, :].repeat(len(idx), 0)[mask].reshape(len(idx), n)
        py = pooled[None, :].repeat(len(idx), 0)[~mask].reshape(len(idx), total - n)
        return float(np.mean(np.abs(_stat(px, py)) >= observed - eps))
    rng = _rng(seed)
    perms = np.array([rng.permutation(pooled) for _ in range(MAX_EXACT)])  # (P, total)
    hits = np.sum(np.abs(_stat(perms[:, :n], perms[:, n:])) >= observed - eps)
    return float((hits + 1) / (MAX_EXACT + 1))


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
            higher_is_better: bool = True, alpha: float = 0.05, conf: float = 0.95, seed: int | None = None) -> Comparison:
    """`fabric` against `baseline` on one metric's per-trial values."""
    x, y = list(values), list(base)
    ratio, lo, hi = bootstrap_ratio(x, y, conf=conf, seed=seed)
    # "faster" in speed terms: throughput ratio, or the inverse ratio of a time/latency
    s, slo, shi = (ratio, lo, hi) if higher_is_better else (1 / ratio, 1 / hi, 1 / lo)
    if len(x) < 2 or len(y) < 2:
        p, sig = math.nan, False
        verdict = (f"insufficient trials ({len(x)} vs {len(y)}; need >= 2 each, >= 4 to detect a difference): "
                   f"{fabric}/{baseline} speed ratio {s:.3f}, not tested")
    else:
        p = permutation_p(x, y, seed=seed)
        sig = bool(p < alpha and (slo > 1 or shi < 1))
        if sig and s > 1:
            verdict = f"{fabric} is faster than {baseline} by {100 * (s - 1):.1f}% [{100 * (slo - 1):.1f}, {100 * (shi - 1):.1f}] (p={p:.3g}, n={len(x)} vs {len(y)})"
        elif sig:
            verdict = (f"{baseline} is faster than {fabric} by {100 * (1 / s - 1):.1f}% [{100 * (1 / shi - 1):.1f}, "
                       f"{100 * (1 / slo - 1):.1f}] (p={p:.3g}, n={len(y)} vs {len(x)})")
        else:
            verdict = (f"no significant difference: {fabric} vs {baseline} {100 * (s - 1):+.1f}% "
                       f"[{100 * (slo - 1):+.1f}, {100 * (shi - 1):+.1f}] (p={p:.3g}, n={len(x)} vs {len(y)})")
    return Comparison(metric, fabric, baseline, len(x), len(y), float(np.median(x)), float(np.median(y)),
                      ratio, lo, hi, p, s, slo, shi, sig, verdict)
