"""The parts of a prediction interval: parameter draws over resampled blocks, the measured
noise and how it grows with scale, and the quantiles the margins take."""

from __future__ import annotations

import math
from statistics import median
from typing import Any

from analysis.projection.fit import _cells, fit_params
from analysis.projection.forms import model_time
from analysis.projection.records import Point


def _quantile(xs: list[float], q: float) -> float:
    """The conformal quantile: the ceil((n+1) q)-th smallest (the largest when that passes n)."""
    xs = sorted(xs)
    if not xs:
        return 0.0
    k = min(len(xs), math.ceil((len(xs) + 1) * q))
    return xs[k - 1]


def _blocks(pts: list[Point]) -> dict[int, dict[str, list[Point]]]:
    """scale -> block -> its points."""
    out: dict[int, dict[str, list[Point]]] = {}
    for pt in pts:
        out.setdefault(pt.p, {}).setdefault(pt.block, []).append(pt)
    return out


def _draws(op: str, blocks: dict[int, dict[str, list[Point]]], resid: dict[tuple[int, int], float],
           params: tuple[float, ...], boot: int, seed: int, form: str) -> list[tuple[float, float, float, float]]:
    """`boot` refits on resampled blocks, within each scale; with one block at some scale, on the
    fit's own log residuals resampled instead (resid: (p, size) -> log(measured / fitted))."""
    import numpy as np

    rng = np.random.default_rng(seed)
    keys = sorted(resid)
    draws = []
    for _ in range(boot):
        if all(len(v) >= 2 for v in blocks.values()):
            sample = []
            for p in sorted(blocks):
                names = sorted(blocks[p])
                for i in rng.integers(0, len(names), len(names)):
                    sample += blocks[p][names[i]]
            c = _cells(sample)
        else:
            r = [resid[keys[i]] for i in rng.integers(0, len(keys), len(keys))]
            c = {k: model_time(op, k[0], k[1], *params[:3], form, params[3]) * math.exp(e) for k, e in zip(keys, r)}
        draws.append(fit_params(op, [(p, s, t) for (p, s), t in c.items()], form))
    return draws


def _noise(blocks: dict[int, dict[str, list[Point]]]) -> dict[int, float | None]:
    """Per scale, the spread of log time between blocks at one size, pooled over sizes (None
    with fewer than two blocks)."""
    noise = {}
    for p in sorted(blocks):
        per_size: dict[int, list[float]] = {}
        for blk in blocks[p].values():
            for s, ts in _by_size(blk).items():
                per_size.setdefault(s, []).append(math.log(median(ts)))
        devs = [(x - sum(v) / len(v)) ** 2 for v in per_size.values() if len(v) >= 2 for x in v]
        dof = sum(len(v) - 1 for v in per_size.values() if len(v) >= 2)
        noise[p] = math.sqrt(sum(devs) / dof) if dof else None
    return noise


def _ends(xs: list[float]) -> list[float]:
    """The 5th and 95th percentiles: a 90% interval's ends."""
    import numpy as np

    return [float(x) for x in np.quantile(xs, [0.05, 0.95])]


def _by_size(pts: list[Point]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for pt in pts:
        out.setdefault(pt.size, []).append(pt.time_s)
    return out


def noise_at(c: dict[str, Any], p: int) -> float:
    """log-sd of block-to-block noise at p ranks: measured at the largest scale that has it, grown
    as sqrt(ln p / ln p_ref) above it (0 when no scale had two blocks)."""
    known = [(int(k), v) for k, v in c["noise_log_sd"].items() if v is not None]
    if not known:
        return 0.0
    ref, sd = max(known)
    return sd * math.sqrt(max(1.0, math.log(p) / math.log(ref)))
