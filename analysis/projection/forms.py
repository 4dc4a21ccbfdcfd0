"""The model forms: the ring algorithm's alpha-beta cost per collective and Gloo's own ring
(docs/projection.md); the constants every part of the projection shares."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

SCHEMA = "fabricbench.calibration/2"     # 2: parametric-bootstrap PIs, the model-form allowance apart
PI_LEVEL = 0.90
MODEL_ONLY = 2          # beyond this many times the largest measured scale a projection is model-only
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
