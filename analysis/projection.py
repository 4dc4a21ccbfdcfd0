"""Projection to scale: an alpha-beta model fitted to collectives records, with prediction intervals.

Per fabric and collective the time of one call of S bytes (nccl-tests' size column) over p ranks
is the ring algorithm's cost (docs/projection.md):

    T(S, p) = L(p) x (alpha + kappa x log2(p/2)) + S x G(p) / B

    all_reduce       L = 2(p-1)   G = 2(p-1)/p     (reduce-scatter then all-gather around the ring)
    all_gather,
    reduce_scatter   L = p-1      G = (p-1)/p      (S the total buffer, as nccl-tests sizes them)
    alltoall         L = p-1      G = (p-1)/p      (p-1 exchanges; S the total buffer)

G is nccl-tests' bus-bandwidth factor, so B is the bus bandwidth a large call approaches (what
`busbw` measures); alpha is the time of one of the L serial steps at 2 ranks, and kappa what a
step gains per doubling of the ranks: a step ends when the slowest of its ranks has been
scheduled and has answered, and the expected maximum of p alike delays grows with log p (on a
host with fewer cores than ranks this is most of a small call's time). kappa needs two scales
to be told from alpha and is 0 in a fit from one. All three are fitted by non-negative least
squares on relative error (each point weighted by 1/T, so a 64 KiB call counts as much as a 16
MiB one) over every scale's points at once.

On a Gloo fabric all_reduce and all_gather take Gloo's own schedule instead (form "gloo",
gloo_ring): two segments in flight per link, each sent once its receive is announced, so a step
costs its bytes or half a round trip and half its bytes, whichever is longer, not the sum; the
same three parameters, fitted robustly (soft L1) so that one cell a host stall hit does not move them.
reduce_scatter there is no ring reduce-scatter at all: torch's ProcessGroupGloo runs
reduce_scatter_tensor as an all_reduce of the whole buffer, then copies out the rank's chunk, so
its form "gloo" is Gloo's all_reduce schedule of S (twice the ring reduce-scatter's bytes).
Gloo's 2-rank all_gather adds a fourth, serial: the share of calls whose late rank's announcements
queued behind its own data on the pair's one connection, each one half chunk longer (serial_segments).

The 90% prediction interval is on log T, with three parts added in quadrature:
  - parameters: the spread of the prediction over refits of resampled *blocks* (a study's blocks;
    loose runs: each run a block), resampled within each scale; a scale measured in one block
    only has no block spread, and then the fit's own residuals are resampled and the
    calibration says so;
  - noise: the block-to-block spread measured at the largest scale, grown with scale as
    sqrt(ln p / ln p_max) (a collective waits for its slowest rank: the expected maximum of p
    alike delays grows as sqrt(2 ln p)); a production fabric's tail at scale is not in it;
  - model form: the held-out error. Each measured scale above the smallest is predicted from the
    scales below it (4 from 2; 8 from 2 and 4); the 90% quantile of |log(measured/predicted)|
    per doubling of the extrapolation distance is the margin, applied x log2(p / largest
    measured) doublings (at least one) beyond the data, and the fit's own residual quantile
    within it. With two scales the held-out fit has one scale, so no kappa: the margin then
    also holds what kappa explains, and is wider than the full model's own error.
A projection beyond MODEL_ONLY x the largest measured scale is labelled model-only.

Everything here reads records or a calibration file; nothing runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any, Iterable

from workloads.core.errors import UsageError

SCHEMA = "fabricbench.calibration/1"
PI_LEVEL = 0.90
MODEL_ONLY = 4          # beyond this many times the largest measured scale a projection is model-only
BOOTSTRAP = 400
SEED = 20261128


def _ring(steps: float, factor: float):
    return lambda p: (steps * (p - 1), factor * (p - 1) / p)


# op -> (the algorithm the formula prices, p -> (L(p), G(p)))
ALGORITHMS: dict[str, tuple[str, Any]] = {
    "all_reduce": ("ring: reduce-scatter then all-gather, 2(p-1) steps", _ring(2, 2)),
    "all_gather": ("ring, p-1 steps", _ring(1, 1)),
    "reduce_scatter": ("ring, p-1 steps", _ring(1, 1)),
    "alltoall": ("p-1 pairwise exchanges", _ring(1, 1)),
}


GLOO_ALGORITHMS = {
    "all_reduce": "Gloo ring: reduce-scatter then all-gather, segments of at most 1 MiB, two in flight",
    "all_gather": "Gloo ring, 2(p-1) half chunks, two in flight",
    "reduce_scatter": "an all_reduce of the whole buffer (Gloo's ring, as all_reduce), then the rank's chunk kept",
}


def terms(op: str, p: int) -> tuple[float, float]:
    """(L(p), G(p)) of `op` at p ranks."""
    return ALGORITHMS[op][1](p)


# Gloo's ring (gloo/allreduce.cc, gloo/allgather.cc) keeps two segments in flight per link and
# sends each only once its receiver has announced the receive (gloo/transport/tcp/pair.cc), so a
# step does not cost a round trip plus its bytes: see gloo_ring below and docs/projection.md.
# torch's ProcessGroupGloo has no reduce-scatter of its own: reduce_scatter_tensor (_reduce_scatter_base
# -> reduce_scatter_tensor_coalesced) clones the input, all_reduces it and copies out the rank's chunk,
# so on Gloo a reduce_scatter of S is an all_reduce of S on the wire (WIRE_OP).
GLOO_FORM_OPS = ("all_reduce", "all_gather", "reduce_scatter")
WIRE_OP = {"reduce_scatter": "all_reduce"}
GLOO_MAX_SEGMENT = 1 << 20      # AllreduceOptions' kMaxSegmentSize (gloo/allreduce.h)


def wire_op(op: str, form: str) -> str:
    """The collective that carries op's bytes: in the gloo form a reduce_scatter is an all_reduce."""
    return WIRE_OP.get(op, op) if form == "gloo" else op


def gloo_segments(op: str, p: int, size: float) -> tuple[int, int, float]:
    """(phases, iterations per phase, bytes per segment) of Gloo's ring at p ranks. all_reduce (and
    reduce_scatter, an all_reduce of its whole buffer): reduce-scatter then all-gather over
    roundUp(max(ceil(S / 1 MiB), 2p), p) segments, (p-1) x segments-per-rank iterations each;
    all_gather: 2(p-1) iterations of half a rank's chunk."""
    if wire_op(op, "gloo") == "all_reduce":
        per_rank = -(-max(-(-int(size) // GLOO_MAX_SEGMENT), 2 * p) // p)
        return 2, (p - 1) * per_rank, size / (per_rank * p)
    return 1, 2 * (p - 1), size / (2 * p)


def gloo_ring(op: str, p: int, size: float, alpha: float, beta: float, kappa: float = 0.0,
              serial: float = 0.0) -> float:
    """Seconds of one Gloo ring call. Every iteration posts a receive (its announcement crosses to
    the sender) and a send, then waits for the pair posted two iterations before; the first two
    start at once. With alpha the announcement's round trip plus the host's cost of an iteration
    and b a segment's bytes x beta, a phase of n iterations takes the longer of its link's bytes
    and a round trip, n x b + alpha, and its round trips, each carrying two segments: ceil(n/2) x
    (alpha + b), plus b when n is even (the pair's second segment queues behind its first).
    `serial` (0-1) is the share of 2-rank all_gather calls whose announcements queued behind the
    late rank's own data: each such call takes one segment longer (serial_segments)."""
    phases, n, seg = gloo_segments(op, p, size)
    a = alpha + kappa * math.log2(p / 2)
    b = seg * beta
    return (phases * max(n * b + a, -(-n // 2) * (a + b) + (b if n % 2 == 0 else 0.0))
            + serial * serial_segments(op, p) * b)


def serial_segments(op: str, p: int) -> int:
    """Segments a call waits longer when the late rank of a pair starts after the other's
    announcements reached it: 1 for Gloo's all_gather at 2 ranks, else 0. gloo/allgather.cc posts
    each iteration's send before its receive, and at 2 ranks both go to the one peer, over one TCP
    connection (gloo/transport/tcp/pair.cc: announcements and data share one transmit queue, in
    order). The late rank finds the early one's announcements, sends its first half at once, and
    its own announcement follows that half down the stream: the early rank's sends wait for it, so
    the call costs 3 halves of a rank's chunk where both directions at once would cost 2. From 4
    ranks the announcements go to the left neighbour and the data to the right, on two connections;
    Gloo's all_reduce posts each receive before its send."""
    return 1 if op == "all_gather" and p == 2 else 0


def model_time(op: str, p: int, size: float, alpha: float, beta: float, kappa: float = 0.0,
               form: str = "ring", serial: float = 0.0) -> float:
    """Seconds of one call. form "ring": L(p) x (alpha + kappa x log2(p/2)) + size x G(p) x beta,
    beta = 1/B in s per byte; form "gloo": gloo_ring."""
    if form == "gloo":
        return gloo_ring(op, p, size, alpha, beta, kappa, serial)
    L, G = terms(op, p)
    return L * (alpha + kappa * math.log2(p / 2)) + size * G * beta


def op_time(c: dict[str, Any], op: str, p: int, size: float) -> float:
    """model_time with a calibrated op's own parameters and form."""
    return model_time(op, p, size, c["alpha_s"], c["beta_s_per_byte"], c["kappa_s"], c.get("form", "ring"),
                      c.get("serial", 0.0))


def form_of(recs: list[tuple[Path, dict[str, Any]]], op: str) -> str:
    """"gloo" when every record ran on Gloo and Gloo's ring runs op, else "ring" (NCCL's and
    the textbook ring: a step is its latency plus its bytes)."""
    gloo = all(str((r.get("fabric") or {}).get("backend") or "").lower() == "gloo" for _, r in recs)
    return "gloo" if gloo and op in GLOO_FORM_OPS else "ring"


# --- reading records ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    op: str
    p: int            # ranks in the communicator
    size: int         # bytes (the size column)
    block: str        # what a bootstrap resamples: "<scale>/<study id>:<block>" or "<scale>/<run>:<trial>"
    time_s: float     # one call, the block timing (nccl-tests' time column), out-of-place when measured


def fabric_of(rec: dict[str, Any]) -> str:
    """The fabric a record ran on: its profile's name, and for an emulated one what the emulator
    set (rate, delay, burst, ...; the node count is the scale, not the fabric): emu-100m asked for
    10mbit is another fabric than emu-100m as shipped."""
    name = str((rec.get("fabric") or {}).get("name") or ((rec.get("config") or {}).get("fabric") or {}).get("name"))
    emu = {k: v for k, v in ((((rec.get("config") or {}).get("fabric") or {}).get("emulate")) or {}).items()
           if k != "nodes" and v is not None and (k, v) not in (("mtu", 1500), ("qdisc", "tbf"))}
    return name + (" (" + ", ".join(f"{k}={v}" for k, v in sorted(emu.items())) + ")" if emu else "")


def code_of(rec: dict[str, Any]) -> tuple[str | None, str | None]:
    git = (rec.get("fingerprint") or {}).get("git") or {}
    return git.get("commit"), git.get("dirty_hash")


def block_of(rec: dict[str, Any]) -> str:
    st = rec.get("study") or {}
    if st.get("block") is not None:
        return f"{st.get('id') or st.get('name')}:{st['block']}"
    return f"{rec.get('run_id')}:{(rec.get('config') or {}).get('trial', 0)}"


def points(rec: dict[str, Any], ops: Iterable[str] | None = None) -> list[Point]:
    """The record's timed cells as Points: one per op and size, the out-of-place time when
    measured, else the in-place one (torch has only in-place all_reduce)."""
    want = set(ops) if ops else set(ALGORITHMS)
    out = []
    for row in rec.get("rows") or []:
        op = row.get("op")
        if op not in want or not row.get("size"):
            continue
        cell = next((row[k] for k in ("out_of_place", "in_place") if row.get(k) and row[k].get("time_us")), None)
        if cell is None:
            continue
        p = int(row.get("group_size") or (rec.get("world") or {}).get("world_size"))
        if p < 2:
            continue
        out.append(Point(op, p, int(row["size"]), f"{p}/{block_of(rec)}", cell["time_us"] / 1e6))
    return out


def _parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S.%f%z"):
        try:
            return datetime.strptime(s, fmt)
        except ValueError:
            pass
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return None


def select(records: list[tuple[Path, dict[str, Any]]], fabric: str | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """The ok collectives records one fit may use, or a UsageError naming why none may: two
    fabrics without --fabric, records of different code, one scale only."""
    recs = [(p, r) for p, r in records if r.get("workload") == "collectives" and r.get("status") == "ok"]
    if not recs:
        raise UsageError("no ok collectives records found; run launch/collectives.py at two or more world sizes "
                         "(emulated: launch/emulate.py --nodes 2, then --nodes 4) and fit their results folder")
    fabrics = sorted({fabric_of(r) for _, r in recs})
    if fabric is not None:
        recs = [(p, r) for p, r in recs if fabric in (fabric_of(r), fabric_of(r).split(" (")[0])]
        if not recs:
            raise UsageError(f"no collectives records of fabric {fabric!r}; these records are of {'; '.join(fabrics)}")
        fabrics = sorted({fabric_of(r) for _, r in recs})
    if len(fabrics) > 1:
        raise UsageError(f"these records are of {len(fabrics)} fabrics ({'; '.join(fabrics)}); one calibration is one "
                         "fabric: pass --fabric NAME (and fit each fabric on its own; an emulated fabric's rate and "
                         "delay are part of it: fit each setting's folder apart)")
    codes = sorted({code_of(r) for _, r in recs}, key=str)
    if len(codes) > 1:
        shown = "; ".join(f"commit {c[0] and c[0][:12]}{' + edits ' + c[1][:8] if c[1] else ''}" for c in codes[:4])
        raise UsageError(f"these records were made by {len(codes)} versions of the code ({shown}); a calibration is "
                         "fitted on one: rerun the sweeps on one commit, or fit each folder apart")
    scales = sorted({pt.p for _, r in recs for pt in points(r)})
    if len(scales) < 2:
        raise UsageError(f"collectives records at one scale only ({', '.join(map(str, scales)) or 'none'} ranks); a fit "
                         "needs two or more (its model-form error is measured by predicting one scale from the "
                         "others): run the same sweep at another world size, e.g. launch/emulate.py --nodes 4")
    return recs


# --- fitting ----------------------------------------------------------------------------------

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
        extra = serial_segments(op, p) * seg
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


def _quantile(xs: list[float], q: float) -> float:
    """The conformal quantile: the ceil((n+1) q)-th smallest (the largest when that passes n)."""
    xs = sorted(xs)
    if not xs:
        return 0.0
    k = min(len(xs), math.ceil((len(xs) + 1) * q))
    return xs[k - 1]


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


def fit_op(op: str, pts: list[Point], boot: int = BOOTSTRAP, seed: int = SEED, form: str = "ring") -> dict[str, Any]:
    """The calibration of one op: parameters with block-bootstrap intervals, the held-out check,
    the noise, and the parameter draws a projection needs."""
    cells = _cells(pts)
    params = fit_params(op, [(p, s, t) for (p, s), t in cells.items()], form)
    a, b, kap, ser = params
    scales = sorted({p for p, _ in cells})
    blocks = _blocks(pts)
    by_block = all(len(v) >= 2 for v in blocks.values())
    resid = {k: math.log(t / model_time(op, k[0], k[1], a, b, kap, form, ser)) for k, t in cells.items()}
    draws = _draws(op, blocks, resid, params, boot, seed, form)
    held = holdout(op, cells, form)
    mf = [abs(h["log_error"]) / h["doublings"] for h in held]
    be = _ends([d[1] for d in draws])
    out = {
        "algorithm": GLOO_ALGORITHMS[op] if form == "gloo" else ALGORITHMS[op][0],
        "form": form,
        "alpha_s": a, "beta_s_per_byte": b, "kappa_s": kap,
        "kappa_90": _ends([d[2] for d in draws]),
        "bandwidth_GBps": (1 / b / 1e9) if b > 0 else None,
        "alpha_90": _ends([d[0] for d in draws]),
        "bandwidth_GBps_90": [1 / x / 1e9 if x > 0 else None for x in (be[1], be[0])],
        "uncertainty": "blocks" if by_block else "residuals (one block at some scale: run 2 or more trials per scale "
                                                 "for block-based intervals)",
        "blocks": {str(p): len(blocks[p]) for p in scales},
        "sizes": sorted({s for _, s in cells}),
        "scales": scales,
        "cells": [{"p": p, "size": s, "time_s": t} for (p, s), t in sorted(cells.items())],
        "residual_q90": _quantile([abs(v) for v in resid.values()], PI_LEVEL),
        "noise_log_sd": {str(p): v for p, v in _noise(blocks).items()},
        "holdout": held,
        "model_form_q90_per_doubling": _quantile(mf, PI_LEVEL) if mf else None,
        "draws": [list(d) for d in draws],
    }
    if form == "gloo" and serial_segments(op, 2):
        out |= {"serial": ser, "serial_90": _ends([d[3] for d in draws])}
    return out


def _by_size(pts: list[Point]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for pt in pts:
        out.setdefault(pt.size, []).append(pt.time_s)
    return out


def latency_floor(recs: list[tuple[Path, dict[str, Any]]], op: str, beta: float, form: str = "ring") -> dict[str, Any]:
    """Per scale, the latency the fabric cannot hide: the fastest call of the smallest size whose
    calls were timed one by one (`row.stability`, collectives.sample_iters; a call's time is its
    slowest rank's), less its bytes (size x G(p) x beta), per ring step (of wire_op's ring: a Gloo
    reduce_scatter's are its all_reduce's). A host that is busy only
    ever adds to a call, so the fastest of many calls is the round trip plus the host's least cost,
    where the block time's mean also holds every scheduling delay of the block (docs/projection.md,
    "Latency"). {} when no record sampled a size of op."""
    best: dict[int, tuple[int, float, int]] = {}      # p -> (size, fastest call s, calls)
    for _, r in recs:
        for row in r.get("rows") or []:
            by_rank = ((row.get("stability") or {}).get("times_us_by_rank")) or {}
            if row.get("op") != op or not by_rank or not row.get("size"):
                continue
            p = int(row.get("group_size") or (r.get("world") or {}).get("world_size"))
            calls = [max(c) / 1e6 for c in zip(*by_rank.values())]
            size, t, n = best.get(p, (row["size"], math.inf, 0))
            if row["size"] < size:
                size, t, n = row["size"], math.inf, 0
            if row["size"] == size:
                best[p] = (size, min(t, min(calls)), n + len(calls))
    out = {}
    for p, (size, t, n) in sorted(best.items()):
        L, G = terms(wire_op(op, form), p)
        out[str(p)] = {"size": size, "calls": n, "fastest_call_s": t, "alpha_floor_s": max(0.0, t - size * G * beta) / L}
    return out


def fit(records: list[tuple[Path, dict[str, Any]]], fabric: str | None = None, ops: Iterable[str] | None = None,
        boot: int = BOOTSTRAP) -> dict[str, Any]:
    """The calibration (a JSON-ready dict) of one fabric from its collectives records."""
    recs = select(records, fabric)
    pts = [pt for _, r in recs for pt in points(r, ops)]
    by_op: dict[str, list[Point]] = {}
    for pt in pts:
        by_op.setdefault(pt.op, []).append(pt)
    fitted = {}
    for op, ps in sorted(by_op.items()):
        if len({pt.p for pt in ps}) >= 2 and len({pt.size for pt in ps}) >= 2:
            form = form_of(recs, op)
            fitted[op] = fit_op(op, ps, boot, form=form)
            fitted[op]["latency_floor"] = latency_floor(recs, op, fitted[op]["beta_s_per_byte"], form)
    if not fitted:
        raise UsageError("no collective was measured at two or more scales and two or more sizes in these records; "
                         "sweep a size range (collectives.minbytes=64K collectives.maxbytes=16M) at each world size")
    first = recs[0][1]
    commit, dirty = code_of(first)
    # the fabric's latency: the least floor of any op at the smallest scale (each op's floor is the
    # round trip plus that op's least host cost: Gloo's all_reduce adds its reduction and wake-ups)
    floors = [(int(p), f["alpha_floor_s"], op) for op, c in fitted.items() for p, f in c["latency_floor"].items()]
    floor = None
    if floors:
        p0 = min(p for p, _, _ in floors)
        a0, op0 = min((a, op) for p, a, op in floors if p == p0)
        floor = {"p": p0, "op": op0, "alpha_floor_s": a0}
    payload = [(r.get("line_rate") or {}).get("payload_per_comm(GB/s)") for _, r in recs]
    line = [(r.get("line_rate") or {}).get("per_comm(GB/s)") for _, r in recs]
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"),
        "fabric": fabric_of(first),
        "emulate": ((first.get("config") or {}).get("fabric") or {}).get("emulate"),
        "code": {"commit": commit, "dirty_hash": dirty},
        "records": sorted({str(p) for p, _ in recs}),
        "records_digest": hashlib.sha256("\n".join(sorted(str(r.get("record_id")) for _, r in recs)).encode()).hexdigest()[:16],
        "newest_record": max((r.get("created") or "" for _, r in recs), default=None),
        "payload_GBps": min(payload) if payload and all(payload) else None,
        "line_rate_GBps": min(line) if line and all(line) else None,
        "pi_level": PI_LEVEL,
        "model_only_beyond": MODEL_ONLY,
        "latency_floor": floor,
        "ops": fitted,
    }


# --- projecting -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Projection:
    fabric: str
    op: str
    p: int
    size: int
    time_s: float
    low_s: float
    high_s: float
    half_log: float        # the interval's half-width on log T
    label: str             # measured | interpolated | extrapolated | model-only

    @property
    def busbw_GBps(self) -> float:
        return self.size / self.time_s * terms(self.op, self.p)[1] / 1e9


def load(path: str | Path) -> dict[str, Any]:
    try:
        cal = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read a calibration ({e.__class__.__name__}); make one with "
                         "`fabricbench model fit RESULTS --out cal.json`") from None
    if not isinstance(cal, dict) or cal.get("schema") != SCHEMA:
        raise UsageError(f"{path} is not a {SCHEMA} calibration (schema {cal.get('schema') if isinstance(cal, dict) else None!r}); "
                         "refit with `fabricbench model fit`")
    return cal


def label(p: int, scales: list[int]) -> str:
    top = max(scales)
    if p in scales:
        return "measured"
    if p < top:
        return "interpolated"
    return "extrapolated" if p <= MODEL_ONLY * top else "model-only"


def noise_at(c: dict[str, Any], p: int) -> float:
    """log-sd of block-to-block noise at p ranks: measured at the largest scale that has it, grown
    as sqrt(ln p / ln p_ref) above it (0 when no scale had two blocks)."""
    known = [(int(k), v) for k, v in c["noise_log_sd"].items() if v is not None]
    if not known:
        return 0.0
    ref, sd = max(known)
    return sd * math.sqrt(max(1.0, math.log(p) / math.log(ref)))


def project(cal: dict[str, Any], op: str, p: int, size: int) -> Projection:
    from scipy import stats

    if op not in cal["ops"]:
        raise UsageError(f"the calibration of {cal['fabric']} has no {op} (it has {', '.join(cal['ops'])})")
    c = cal["ops"][op]
    t = op_time(c, op, p, size)
    shape = c.get("form", "ring")      # a calibration written before serial has three numbers a draw
    logs = [math.log(v) for d in c["draws"] if (v := model_time(op, p, size, *d[:3], shape, (d[3:] or [0.0])[0])) > 0]
    mean = sum(logs) / len(logs)
    param_sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / max(1, len(logs) - 1))
    z = stats.norm.ppf(0.5 + cal["pi_level"] / 2)
    lab = label(p, c["scales"])
    top = max(c["scales"])
    if lab in ("extrapolated", "model-only"):
        per = c["model_form_q90_per_doubling"] or 0.0
        form = per * max(1.0, math.log2(p / top))
    else:
        form = c["residual_q90"]
    half = math.sqrt((z * param_sd) ** 2 + (z * noise_at(c, p)) ** 2 + form ** 2)
    return Projection(cal["fabric"], op, p, size, t, t * math.exp(-half), t * math.exp(half), half, lab)


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"--ranks {text!r}: give whole numbers separated by commas, e.g. --ranks 64,512") from None
    if not ranks or any(r < 2 for r in ranks):
        raise UsageError(f"--ranks {text!r}: every scale must be 2 ranks or more")
    return ranks


def projection_line(pr: Projection) -> str:
    tag = {"model-only": f"model-only: beyond {MODEL_ONLY}x the largest measured scale, nothing measured supports "
                         "this; the interval assumes the model's ring schedule still holds"}.get(pr.label, pr.label)
    return (f"{pr.fabric} {pr.op} {_size(pr.size)} at {pr.p} ranks: {pr.time_s * 1e3:.3f} ms "
            f"[{pr.low_s * 1e3:.3f}, {pr.high_s * 1e3:.3f}] ({round(100 * PI_LEVEL)}% PI), busbw "
            f"{pr.busbw_GBps:.4g} GB/s [{pr.size / pr.high_s * terms(pr.op, pr.p)[1] / 1e9:.4g}, "
            f"{pr.size / pr.low_s * terms(pr.op, pr.p)[1] / 1e9:.4g}]; {tag}")


def compare(a: Projection, b: Projection) -> str:
    """The verdict of a projected comparison, in the study's words: `at 512 ranks, A is faster
    than B by x% [lo, hi] (90% PI)`, x = the slower one's time over the faster one's, minus 1;
    or `cannot tell at that scale` when the interval holds 0."""
    d = math.log(b.time_s / a.time_s)
    half = math.sqrt(a.half_log ** 2 + b.half_log ** 2)
    lo, hi = d - half, d + half
    fast, slow = (a, b) if d >= 0 else (b, a)
    lo, hi = (lo, hi) if d >= 0 else (-hi, -lo)
    pct = lambda x: 100 * (math.exp(x) - 1)  # noqa: E731
    where = f"at {a.p} ranks, {a.op} {_size(a.size)}"
    labels = {a.label, b.label}
    note = " (model-only projection)" if "model-only" in labels else ""
    if lo <= 0:
        return (f"{where}: cannot tell at that scale: {fast.fabric} faster than {slow.fabric} by {pct(abs(d)):.1f}% "
                f"[{pct(lo):+.1f}, {pct(hi):+.1f}] ({round(100 * PI_LEVEL)}% PI){note}")
    return (f"{where}: {fast.fabric} is faster than {slow.fabric} by {pct(abs(d)):.1f}% [{pct(lo):.1f}, {pct(hi):.1f}] "
            f"({round(100 * PI_LEVEL)}% PI){note}")


def _size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


# --- checking a calibration against records it did not see ----------------------------------

def check_against(cal: dict[str, Any], records: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per measured cell of `records` (same fabric, same code): the projection and whether the
    measurement fell inside its interval. Refused with one line when the records are of another
    fabric or other code than the calibration, or newer code than it."""
    recs = [(p, r) for p, r in records if r.get("workload") == "collectives" and r.get("status") == "ok"]
    if not recs:
        raise UsageError("no ok collectives records to check the calibration against")
    other = sorted({fabric_of(r) for _, r in recs} - {cal["fabric"]})
    if other:
        raise UsageError(f"these records are of {', '.join(other)}, the calibration of {cal['fabric']}; check a "
                         "calibration against its own fabric's records")
    made = _parse_time(cal.get("created"))
    for path, r in recs:
        commit, dirty = code_of(r)
        if (commit, dirty) != (cal["code"]["commit"], cal["code"]["dirty_hash"]):
            when = _parse_time(r.get("created"))
            older = " is older than these records and" if made and when and when > made else ""
            raise UsageError(f"the calibration{older} was fitted on other code (commit {str(cal['code']['commit'])[:12]}) "
                             f"than {path.name} (commit {str(commit)[:12]}{', with edits' if dirty else ''}); refit "
                             "with `fabricbench model fit` on records of the same code")
    out = []
    for op, ps in _group_op([pt for _, r in recs for pt in points(r, cal["ops"])]).items():
        for (p, s), t in sorted(_cells(ps).items()):
            pr = project(cal, op, p, s)
            out.append({"op": op, "p": p, "size": s, "measured_s": t, "predicted_s": pr.time_s, "low_s": pr.low_s,
                        "high_s": pr.high_s, "inside": pr.low_s <= t <= pr.high_s, "label": pr.label,
                        "abs_error": abs(t / pr.time_s - 1)})
    return out


def _group_op(pts: list[Point]) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for pt in pts:
        out.setdefault(pt.op, []).append(pt)
    return out


def check_summary(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no cell of these records is a collective the calibration has"
    inside = sum(r["inside"] for r in rows)
    return (f"{inside} of {len(rows)} measured cells inside their {round(100 * PI_LEVEL)}% PI "
            f"({100 * inside / len(rows):.0f}%); median |error| {100 * median(r['abs_error'] for r in rows):.1f}%")


def fit_lines(cal: dict[str, Any]) -> list[str]:
    """What `model fit` prints: per op the parameters with their 90% intervals and the held-out check."""
    out = [f"calibration of {cal['fabric']} (commit {str(cal['code']['commit'])[:12]}"
           f"{', with edits' if cal['code']['dirty_hash'] else ''}) from {len(cal['records'])} records"]
    floor = cal.get("latency_floor")
    if floor:
        out.append(f"  latency: {floor['alpha_floor_s'] * 1e6:.1f} us per ring step at {floor['p']} ranks (the fastest "
                   f"{floor['op']} call of the smallest sampled size, less its bytes: the fabric's round trip plus the "
                   "host's least cost)")
    for op, c in cal["ops"].items():
        lo, hi = c["alpha_90"]
        blo, bhi = c["bandwidth_GBps_90"]
        klo, khi = c["kappa_90"]
        unit = "per iteration (its announcement's round trip and the host's cost)" if c.get("form") == "gloo" else "per step"
        line = (f"  {op} ({c['algorithm']}): alpha {c['alpha_s'] * 1e6:.1f} us [{lo * 1e6:.1f}, {hi * 1e6:.1f}] {unit} "
                f"at 2 ranks, + {c['kappa_s'] * 1e6:.1f} us [{klo * 1e6:.1f}, {khi * 1e6:.1f}] per doubling, "
                f"B {c['bandwidth_GBps']:.5g} GB/s [{blo:.5g}, {bhi:.5g}] bus bandwidth (90% intervals over "
                f"{c['uncertainty'].split(' (')[0]}); scales {', '.join(map(str, c['scales']))}, blocks "
                f"{', '.join(f'{k}: {v}' for k, v in c['blocks'].items())}")
        if cal.get("payload_GBps") and c["bandwidth_GBps"]:
            line += f"; {100 * c['bandwidth_GBps'] / cal['payload_GBps']:.1f}% of the link's TCP payload ceiling"
        out.append(line)
        if "serial" in c:
            slo, shi = c["serial_90"]
            out.append(f"    at 2 ranks {100 * c['serial']:.0f}% [{100 * slo:.0f}, {100 * shi:.0f}] of the calls took a half "
                       "chunk longer: the late rank's announcements queued behind its own data on the one connection")
        floor = c.get("latency_floor") or {}
        if floor:
            p0, f = min(floor.items(), key=lambda kv: int(kv[0]))
            out.append(f"    latency floor: {f['alpha_floor_s'] * 1e6:.1f} us per step at {p0} ranks (the fastest of "
                       f"{f['calls']} calls of {_size(f['size'])}, less its bytes; alpha also holds the host's typical "
                       "cost of a step)")
        held = c["holdout"]
        if held:
            errs = [abs(math.exp(h["log_error"]) - 1) for h in held]
            out.append(f"    held out: {', '.join(sorted({str(h['p']) + ' from ' + '+'.join(map(str, h['from'])) for h in held}))}: "
                       f"median |error| {100 * median(errs):.1f}%, worst {100 * max(errs):.1f}%; model-form margin "
                       f"{100 * (math.exp(c['model_form_q90_per_doubling']) - 1):.1f}% per doubling of scale")
    return out


# --- training: the step time at other scales -------------------------------------------------

def _call_size(op: str, numel: int, dtype: str, p0: int) -> int:
    """nccl-tests' size of a traced call: an all_reduce's (broadcast's, alltoall's) buffer; an
    all_gather's or reduce_scatter's whole buffer, the rank's part x its ranks (ZeRO's shards
    shrink as ranks grow; the whole stays)."""
    item = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 1)
    n = numel * item
    return n * p0 if op in ("all_gather", "reduce_scatter") else n


_TRACE_OPS = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "all_gather": "all_gather",
              "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter": "reduce_scatter",
              "all_to_all_single": "alltoall"}


@dataclass(frozen=True)
class StepProjection:
    p: int
    step_s: float
    low_s: float
    high_s: float
    measured_step_s: float
    measured_comm_s: float
    comm_s: float           # projected time with a collective in flight
    label: str
    ranks: int              # the record's own scale


def project_step(cal: dict[str, Any], rec: dict[str, Any], p: int) -> StepProjection:
    """A training record's step time at p ranks: the time with no collective in flight stays
    (compute the communication did not overlap), and the time with one in flight (CommTimer's,
    overlap included) scales as the calibrated model's time of the step's own collectives (the
    record's trace) at p over its time at the record's scale (as the calibration's sweep measured
    it there, when it did: measured_at). The interval: each call's 90% PI at p, and the record's
    step-to-step spread (z x sd / sqrt(steps)); its low end also drops what the record's calls
    spent beyond the sweep's time for them (waiting for a peer or the host)."""
    from scipy import stats

    from workloads import catalog

    if not catalog.field(rec.get("workload"), "training", False) or rec.get("status") != "ok":
        raise UsageError("--training takes an ok training record (pretrain or finetune)")
    if fabric_of(rec) != cal["fabric"]:
        raise UsageError(f"the training record ran on {fabric_of(rec)}, the calibration is of {cal['fabric']}; "
                         "project a record with its own fabric's calibration")
    if code_of(rec) != (cal["code"]["commit"], cal["code"]["dirty_hash"]):
        raise UsageError(f"the training record was made by other code (commit {str(code_of(rec)[0])[:12]}) than the "
                         f"calibration (commit {str(cal['code']['commit'])[:12]}); refit or rerun on one commit")
    calls = (rec.get("samples") or {}).get("comm_calls")
    m = rec.get("metrics") or {}
    if not calls or m.get("comm_share") is None:
        raise UsageError("the training record holds no collectives trace (samples.comm_calls) or comm share; rerun it "
                         "on this version")
    p0 = int((rec.get("world") or {}).get("world_size"))
    step, comm = float(m["iteration_time(s)"]), float(m["comm_share"]) * float(m["iteration_time(s)"])
    at, lows, highs, base, took, labels = _price_calls(cal, calls, p, p0)
    other = max(0.0, step - comm) * host_share(rec, p)
    z = stats.norm.ppf(0.5 + cal["pi_level"] / 2)
    n = int(m.get("measured_steps") or 1)
    spread = z * float(m.get("iteration_time_std(s)") or 0.0) / math.sqrt(n)
    order = ("model-only", "extrapolated", "interpolated", "measured")
    lab = next(x for x in order if x in labels)
    # The calls took longer in the run than the sweep measured them at its scale (took > base): a
    # rank waited for a peer still computing, or for the host. That wait is not the fabric's, and
    # one run does not say whether it grows with the collectives (CI: a 2-node run whose calls took
    # 1.0 s where the sweep measured 0.8 s was projected to 1609 ms [1361, 1870] at 4 nodes, where
    # the 4-node run waited less and measured 1331 ms): the interval reaches down to the step
    # without it, the centre scales it with the collectives as the rest.
    low_base = max(base, took)
    return StepProjection(p, other + comm * at / base, other + comm * lows / low_base - spread,
                          other + comm * highs / base + spread, step, comm, comm * at / base, lab, p0)


def _price_calls(cal: dict[str, Any], calls: list, p: int, p0: int) -> tuple[float, float, float, float, float, set]:
    """Over a record's traced calls: their projected time at p with its PI's ends, their time at
    the record's scale p0 (the sweep's, else the model's), the time they took in the run (rank 0's
    launch to completion) and the projections' labels."""
    at = base = lows = highs = took = 0.0
    labels = set()
    groups = sorted({c[3] for one in calls for c in one if c[3] and c[3] != p0})
    if groups:
        raise UsageError(f"the record's steps run collectives on groups of {groups} ranks (tensor or expert "
                         f"parallel), not all {p0}: the step projection prices whole-world (DP) collectives only")
    for one in calls:
        for name, dtype, numel, _, start, end in one:
            op = _TRACE_OPS.get(name)
            if op is None or not numel:
                continue
            took += max(0.0, float(end) - float(start)) if start is not None and end is not None else 0.0
            if op not in cal["ops"]:
                raise UsageError(f"the record's steps run {op}, which the calibration of {cal['fabric']} lacks; "
                                 f"calibrate it (collectives.ops=[{op}])")
            if name == "reduce_scatter" and cal["ops"][op].get("form") == "gloo":
                # ProcessGroupGloo::reduce_scatter (a list of tensors) enqueues p all_reduces of S/p on
                # the group's worker threads, not reduce_scatter_tensor's one all_reduce of S
                raise UsageError("the record's steps run the list form of reduce_scatter, which Gloo runs as p "
                                 "all_reduces of S/p that this model does not price; use reduce_scatter_tensor "
                                 "(what ZeRO calls where torch has it), which it does")
            size = _call_size(op, numel, dtype, p0)
            pr = project(cal, op, p, size)
            at, lows, highs = at + pr.time_s, lows + pr.low_s, highs + pr.high_s
            c = cal["ops"][op]
            base += measured_at(c, p0, size) or op_time(c, op, p0, size)
            labels.add(pr.label)
    if base <= 0:
        raise UsageError("the record's trace holds no collective the model prices")
    return at, lows, highs, base, took, labels


def measured_at(c: dict[str, Any], p: int, size: int) -> float | None:
    """What the calibration's sweep measured for one call of `size` bytes at p ranks: log-log
    interpolation between the two measured sizes around it; None when p was not measured or size
    lies outside the sweep. The step projection prices the record's own scale by this, so the
    model's error at that scale (Gloo's 2-rank ring is slower than its bytes) is not carried into
    the ratio."""
    pts = sorted((x["size"], x["time_s"]) for x in c["cells"] if x["p"] == p)
    for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
        if s0 <= size <= s1:
            f = math.log(size / s0) / math.log(s1 / s0)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return None


def host_share(rec: dict[str, Any], p: int) -> float:
    """How much longer a step's compute takes at p ranks than at the record's own scale, when every
    rank shares one host's cores (an emulated fabric: all its nodes are namespaces of this machine):
    max(1, p / cores) over the same at the record's scale. 1 on real nodes, whose ranks each have
    their own device: a fabric model cannot see compute, and on a cluster it does not change with DP
    width."""
    if not (((rec.get("config") or {}).get("fabric") or {}).get("emulate")):
        return 1.0
    fp = rec.get("fingerprint") or {}
    cores = fp.get("cpu_affinity") or fp.get("cpu_count")
    if not cores:
        return 1.0
    p0 = int((rec.get("world") or {}).get("world_size") or 1)
    return max(1.0, p / cores) / max(1.0, p0 / cores)


def step_line(sp: StepProjection) -> str:
    return (f"training step at {sp.p} ranks: {sp.step_s * 1e3:.1f} ms [{sp.low_s * 1e3:.1f}, {sp.high_s * 1e3:.1f}] "
            f"({round(100 * PI_LEVEL)}% PI; communication {sp.comm_s * 1e3:.1f} ms of it) from {sp.measured_step_s * 1e3:.1f} "
            f"ms measured at {sp.ranks} ranks ({sp.measured_comm_s * 1e3:.1f} ms with a collective in flight); {sp.label}")
