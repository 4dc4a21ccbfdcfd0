"""The parts of a prediction interval (docs/projection.md, "The interval"):

- parameters and noise, one term: a parametric bootstrap of the whole procedure. Each draw makes
  the measured cells again from the fitted model (each cell the median of its blocks, each block
  the model's time times the measured noise), refits them as the fit did, and keeps the refit's
  parameters beside a noise factor (the noise sd is itself estimated from few blocks: each draw
  scales it by sqrt(dof / chi2(dof)), so that a fit from 3 blocks is not as sure as one from 30).
  A projection prices the target with every draw and adds the target's own noise; the interval is
  the spread of (truth in the bootstrap world + noise) - (the draw's prediction).
- the model-form allowance, apart and named: the error of predicting each measured scale from
  the ones below it, one unit a held-out *scale* (the sizes of one scale share its error, they are
  not independent units). With n units the largest is the margin and its level is n / (n + 1)
  (50% from one held-out scale); from 9 units on, the conformal 90% quantile.
"""

from __future__ import annotations

import math
from statistics import median
from typing import Any

from analysis.projection.fit import fit_params_many
from analysis.projection.forms import PI_LEVEL, model_time
from analysis.projection.records import Point


def _quantile(xs: list[float], q: float) -> float:
    """The conformal quantile: the ceil((n+1) q)-th smallest (the largest when that passes n)."""
    xs = sorted(xs)
    if not xs:
        return 0.0
    k = min(len(xs), math.ceil((len(xs) + 1) * q))
    return xs[k - 1]


def attainable(n: int, level: float = PI_LEVEL) -> float:
    """The level a conformal margin over n exchangeable units can claim: `level`, or n / (n + 1)
    when fewer units than that needs (the largest of n covers a new unit with probability n/(n+1))."""
    return min(level, n / (n + 1)) if n else 0.0


def _blocks(pts: list[Point]) -> dict[int, dict[str, list[Point]]]:
    """scale -> block -> its points."""
    out: dict[int, dict[str, list[Point]]] = {}
    for pt in pts:
        out.setdefault(pt.p, {}).setdefault(pt.block, []).append(pt)
    return out


def _noise(blocks: dict[int, dict[str, list[Point]]]) -> dict[int, tuple[float | None, int]]:
    """Per scale, the spread of log time between blocks at one size, pooled over sizes, and its
    degrees of freedom ((None, 0) with fewer than two blocks)."""
    noise = {}
    for p in sorted(blocks):
        per_size: dict[int, list[float]] = {}
        for blk in blocks[p].values():
            for s, ts in _by_size(blk).items():
                per_size.setdefault(s, []).append(math.log(median(ts)))
        devs = [(x - sum(v) / len(v)) ** 2 for v in per_size.values() if len(v) >= 2 for x in v]
        dof = sum(len(v) - 1 for v in per_size.values() if len(v) >= 2)
        noise[p] = (math.sqrt(sum(devs) / dof), dof) if dof else (None, 0)
    return noise


def noise_model(blocks: dict[int, dict[str, list[Point]]], resid: dict[tuple[int, int], float],
                nparams: int) -> dict[str, Any]:
    """The noise of one block's time at each measured scale (log sd) and its degrees of freedom:
    measured between blocks where every scale has two or more; else the fit's own log residuals
    (a cell of one block is one block's time), sd over n - nparams."""
    measured = _noise(blocks)
    if all(sd is not None for sd, _ in measured.values()):
        return {"sd": {str(p): sd for p, (sd, _) in measured.items()},
                "dof": sum(d for _, d in measured.values()), "source": "blocks",
                "dof_by_scale": {str(p): d for p, (_, d) in measured.items()}}
    dof = max(0, len(resid) - nparams)
    sd = math.sqrt(sum(e * e for e in resid.values()) / dof) if dof else 0.0
    return {"sd": {str(p): sd for p in measured}, "dof": dof, "source": "residuals"}


def parametric_draws(op: str, cells: dict[tuple[int, int], float], nblocks: dict[tuple[int, int], int],
                     params: tuple[float, ...], noise: dict[str, Any], boot: int, seed: int,
                     form: str) -> list[list[float]]:
    """`boot` refits of cells made again from the fitted model and the noise model: per draw
    [alpha, beta, kappa, serial, g], g the draw's noise factor sqrt(dof / chi2(dof))."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dofs = noise.get("dof_by_scale") or {k: noise["dof"] for k in noise["sd"]}
    g = {k: np.sqrt(d / rng.chisquare(d, boot)) if d else np.ones(boot) for k, d in sorted(dofs.items(), key=lambda kv: int(kv[0]))}
    keys = sorted(cells)
    made = np.empty((boot, len(keys)))
    for j, (p, s) in enumerate(keys):                 # vectorised over the draws, one cell at a time
        log_t = math.log(model_time(op, p, s, *params[:3], form, params[3]))
        eps = rng.standard_normal((boot, nblocks[(p, s)]))
        made[:, j] = np.exp(log_t + np.median(eps, axis=1) * g[str(p)] * noise["sd"][str(p)])
    g = g[max(g, key=int)]          # the target's noise is grown from the largest scale's
    return [list(th) + [float(gb)] for th, gb in zip(fit_params_many(op, keys, made, form), g)]


def prediction_errors(c: dict[str, Any], op: str, p: int, size: int, seed: int) -> list[float]:
    """Per draw: log(the bootstrap world's truth at (p, size) with one block's noise) - log(the
    draw's prediction). A calibration written before the noise factor has draws of 3 or 4 numbers:
    their factor is 1."""
    import numpy as np

    form = c.get("form", "ring")
    base = math.log(model_time(op, p, size, c["alpha_s"], c["beta_s_per_byte"], c["kappa_s"], form,
                               c.get("serial", 0.0)))
    sd = noise_at(c, p)
    eps = np.random.default_rng(seed).standard_normal(len(c["draws"]))
    out = []
    for d, e in zip(c["draws"], eps):
        v = model_time(op, p, size, *d[:3], form, (d[3:4] or [0.0])[0])
        if v > 0:
            out.append(base + float(e) * sd * (d[4] if len(d) > 4 else 1.0) - math.log(v))
    return out


def form_units(held: list[dict[str, Any]], resid: dict[tuple[int, int], float]) -> dict[str, Any]:
    """The model-form allowance's units. Beyond the data: per held-out scale, its largest
    |log error| per doubling of extrapolation; within it: per measured scale, the full fit's
    largest |log residual|. Each with its margin and the level that margin attains."""
    beyond: dict[int, float] = {}
    for h in held:
        beyond[h["p"]] = max(beyond.get(h["p"], 0.0), abs(h["log_error"]) / h["doublings"])
    within: dict[int, float] = {}
    for (p, _), e in resid.items():
        within[p] = max(within.get(p, 0.0), abs(e))
    out = {}
    for name, units in (("beyond", beyond), ("within", within)):
        lvl = attainable(len(units))
        out[name] = {"units": {str(k): v for k, v in sorted(units.items())}, "level": lvl,
                     "margin_log": _quantile(list(units.values()), lvl) if units else None}
    return out


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
    """log-sd of one block's noise at p ranks: measured at the largest scale that has it, grown as
    sqrt(ln p / ln p_ref) above it (0 when nothing measured it). The noise model's when the
    calibration has one, else (written before it) the between-block spread."""
    sds = (c.get("noise_model") or {}).get("sd") or c.get("noise_log_sd") or {}
    known = [(int(k), v) for k, v in sds.items() if v is not None]
    if not known:
        return 0.0
    ref, sd = max(known)
    return sd * math.sqrt(max(1.0, math.log(p) / math.log(ref)))
