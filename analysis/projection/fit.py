"""Fitting the model's parameters to cells, and the held-out check of each scale from the ones
below it."""

from __future__ import annotations

import math
from statistics import median
from typing import Any

# serial_segments is looked up on forms at each call, so that a caller (the gloo tests) can set it
# in one place for the fit and the model alike
import analysis.projection.forms as forms
from analysis.projection.forms import gloo_segments, model_time, terms
from analysis.projection.records import Point

# The gloo form's fit is robust (soft L1 on relative error, scale 10%): one cell that a host stall
# hit (4 KiB at 4 nodes: 276 ms beside 31-33 ms for its neighbours) otherwise moves B for every size.
ROBUST_SCALE = 0.10
_IRLS_ROUNDS = 60
# The share of 2-rank all_gather calls taken as serialized (serial_segments) when the points cannot
# tell it from the bandwidth: one scale only, or no 2-rank point.
SERIAL_UNSEEN = 0.0


def _gloo_sides(op: str, pts: list[tuple[int, int, float]]):
    """gloo_ring is linear in (alpha, beta, kappa, serial x beta) on either side of its max: per
    point its bandwidth side's row and its latency side's row."""
    import numpy as np

    bw, lat = [], []
    for p, s, _ in pts:
        phases, n, seg = gloo_segments(op, p, s)
        g, m = math.log2(p / 2), -(-n // 2)
        extra = forms.serial_segments(op, p) * seg
        bw.append([phases, phases * n * seg, phases * g, extra])
        lat.append([phases * m, phases * (m + (1 if n % 2 == 0 else 0)) * seg, phases * m * g, extra])
    return np.array(bw), np.array(lat)


def _irls(bw, lat, y):
    """Non-negative soft-L1 fit of y by the rows of bw or lat, whichever side is longer, by
    reweighted non-negative least squares on relative error until no point changes side."""
    import numpy as np
    from scipy.optimize import nnls

    bw, lat = bw / y[:, None], lat / y[:, None]
    w = np.ones_like(y)
    theta = np.zeros(bw.shape[1])
    on_bw = np.zeros(len(y), dtype=bool)          # start on the latency side everywhere
    for _ in range(_IRLS_ROUNDS):
        x = np.where(on_bw[:, None], bw, lat)
        sw = np.sqrt(w)
        new, _ = nnls(x * sw[:, None], sw)
        w = 1 / np.sqrt(1 + ((x @ new - 1) / ROBUST_SCALE) ** 2)
        on_bw = bw @ new >= lat @ new
        done = bool((np.abs(new - theta) <= 1e-6 * np.abs(theta)).all())
        theta = new
        if done:
            break
    return theta


def _fit_gloo(op: str, pts: list[tuple[int, int, float]], y) -> tuple[float, float, float, float]:
    """fit_params of the gloo form. serial (0-1) is fitted where 2-rank all_gather points sit beside
    another scale's; there beta = e + g and serial = g / beta, so that both stay >= 0 and serial <= 1
    (the columns: alpha, e for the bytes, kappa, g for the bytes and the serialized segment).
    Elsewhere it cannot be told from beta: it is SERIAL_UNSEEN."""
    import numpy as np

    multi = len({p for p, _, _ in pts}) > 1
    bw, lat = _gloo_sides(op, pts)
    free = multi and bool(bw[:, 3].any())
    keep = [0, 1, 2] if multi else [0, 1]

    def cols(x):
        if free:
            return np.column_stack([x[:, 0], x[:, 1], x[:, 2], x[:, 1] + x[:, 3]])
        x = x.copy()
        x[:, 1] += SERIAL_UNSEEN * x[:, 3]
        return x[:, keep]

    theta = _irls(cols(bw), cols(lat), y)
    if not free:
        return float(theta[0]), float(theta[1]), float(theta[2]) if multi else 0.0, SERIAL_UNSEEN
    beta = float(theta[1] + theta[3])
    return float(theta[0]), beta, float(theta[2]), float(theta[3] / beta) if beta > 0 else 0.0


def fit_params(op: str, pts: list[tuple[int, int, float]], form: str = "ring") -> tuple[float, float, float, float]:
    """(alpha s, beta s/byte, kappa s, serial), all >= 0; pts = (p, size, time_s). kappa is 0 when
    the points are of one scale (it cannot be told from alpha there). form "ring": least squares
    on relative error, serial 0; "gloo": the same robustly (soft L1, ROBUST_SCALE), by reweighted
    non-negative least squares over gloo_ring's two linear sides until no point changes side."""
    import numpy as np
    from scipy.optimize import nnls

    multi = len({p for p, _, _ in pts}) > 1
    y = np.array([t for _, _, t in pts], dtype=float)
    if form == "gloo":
        return _fit_gloo(op, pts, y)
    rows = []
    for p, s, _ in pts:
        L, G = terms(op, p)
        rows.append([L, s * G] + ([L * math.log2(p / 2)] if multi else []))
    theta, _ = nnls(np.array(rows, dtype=float) / y[:, None], np.ones_like(y))
    return float(theta[0]), float(theta[1]), float(theta[2]) if multi else 0.0, 0.0


def _cells(pts: list[Point]) -> dict[tuple[int, int], float]:
    """(p, size) -> median time over blocks (each block's own median first)."""
    by_block: dict[tuple[int, int, str], list[float]] = {}
    for pt in pts:
        by_block.setdefault((pt.p, pt.size, pt.block), []).append(pt.time_s)
    per_cell: dict[tuple[int, int], list[float]] = {}
    for (p, s, _), ts in by_block.items():
        per_cell.setdefault((p, s), []).append(median(ts))
    return {k: median(v) for k, v in per_cell.items()}


def holdout(op: str, cells: dict[tuple[int, int], float], form: str = "ring") -> list[dict[str, Any]]:
    """Each measured scale above the smallest, predicted from the scales below it: per size the
    measured and predicted time and the doublings of extrapolation (log2 of p over the largest
    scale fitted)."""
    scales = sorted({p for p, _ in cells})
    out = []
    for k in range(1, len(scales)):
        train = [(p, s, t) for (p, s), t in cells.items() if p < scales[k]]
        a, b, kap, ser = fit_params(op, train, form)
        dist = math.log2(scales[k] / scales[k - 1])
        for (p, s), t in sorted(cells.items()):
            if p == scales[k]:
                pred = model_time(op, p, s, a, b, kap, form, ser)
                out.append({"p": p, "from": scales[:k], "size": s, "measured_s": t, "predicted_s": pred,
                            "log_error": math.log(t / pred), "doublings": dist})
    return out


def fit_params_many(op: str, keys: list[tuple[int, int]], times, form: str = "ring") -> list[tuple[float, float, float, float]]:
    """fit_params of many sets of times at the same cells (times: draws x cells), as fit_params
    would give each. The ring form solves them all at once: where the unconstrained least squares
    of a set is non-negative it is the non-negative one (the problem is convex), and the sets it is
    not for go through fit_params. The gloo form's robust fit goes one set at a time."""
    import numpy as np

    if form == "gloo" or len({p for p, _ in keys}) < 2:
        return [fit_params(op, [(p, s, t) for (p, s), t in zip(keys, row)], form) for row in times]
    x = np.array([[L, s * G, L * math.log2(p / 2)] for p, s in keys for L, G in [terms(op, p)]])
    scale = np.linalg.norm(x, axis=0)
    x = x / scale                                   # columns of one size: the normal equations stay well conditioned
    inv = 1.0 / np.asarray(times, dtype=float)      # relative error: each row of a set weighted by 1/T
    m = np.einsum("bn,ni,nj->bij", inv * inv, x, x)
    theta = np.linalg.solve(m, np.einsum("bn,ni->bi", inv, x)[..., None])[..., 0] / scale
    out = []
    for row, th in zip(times, theta):
        if (th >= 0).all():
            out.append((float(th[0]), float(th[1]), float(th[2]), 0.0))
        else:
            out.append(fit_params(op, [(p, s, t) for (p, s), t in zip(keys, row)], form))
    return out
