"""Tolerances on simulated or resampled rates: one-sided exact binomial bounds at 1%, so that a
rate's check fails by chance at most 1% of the time when the true rate is exactly at its limit."""

from __future__ import annotations

from scipy import stats as sps


def at_most(calls: int, n: int, rate: float) -> bool:
    """`calls` of `n` are consistent with a true rate <= `rate`."""
    return sps.binomtest(calls, n, rate, alternative="greater").pvalue > 0.01


def at_least(hits: int, n: int, rate: float) -> bool:
    """`hits` of `n` are consistent with a true rate >= `rate`."""
    return sps.binomtest(hits, n, rate, alternative="less").pvalue > 0.01
