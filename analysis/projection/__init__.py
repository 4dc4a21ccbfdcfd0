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

The 90% prediction interval (parameters and noise) is a parametric bootstrap of the whole
procedure; the model-form allowance, from held-out scales, is a separate term with the level its
few units attain; beyond MODEL_ONLY x the largest measured scale a projection is model-only and
its interval held above the schedule's floor (intervals.py, project.py, docs/projection.md).

Everything here reads records or a calibration file; nothing runs. The parts: forms (the model's
cost per collective), records (what a fit may use), fit (parameters and the held-out check),
intervals (draws, noise, quantiles), calibration (fit, load), project, check (against records the
fit did not see), step (a training step at other scales), lines (what the commands print), report
(the report's section).
"""

from __future__ import annotations

from analysis.projection.calibration import fit, fit_op, latency_floor, load, problem
from analysis.projection.check import _group_op, check_against, left_out
from analysis.projection.fit import ROBUST_SCALE, SERIAL_UNSEEN, _cells, fit_params, holdout
from analysis.projection.forms import (
                                       ALGORITHMS,
                                       BOOTSTRAP,
                                       GLOO_ALGORITHMS,
                                       GLOO_FORM_OPS,
                                       GLOO_MAX_SEGMENT,
                                       MODEL_ONLY,
                                       PI_LEVEL,
                                       SCHEMA,
                                       SEED,
                                       WIRE_OP,
                                       form_of,
                                       gloo_ring,
                                       gloo_segments,
                                       model_time,
                                       op_time,
                                       serial_segments,
                                       terms,
                                       wire_op,
)
from analysis.projection.intervals import (
                                       _blocks,
                                       _by_size,
                                       _ends,
                                       _noise,
                                       _quantile,
                                       attainable,
                                       form_units,
                                       noise_at,
                                       noise_model,
                                       parametric_draws,
                                       prediction_errors,
)
from analysis.projection.lines import (
                                       _size,
                                       check_summary,
                                       compare,
                                       fit_lines,
                                       form_words,
                                       noise_lines,
                                       projection_line,
                                       step_line,
)
from analysis.projection.project import Projection, label, parse_ranks, project, schedule_floor
from analysis.projection.records import Point, _parse_time, block_of, check_times, code_of, fabric_of, points, select
from analysis.projection.step import StepProjection, _call_size, _price_calls, host_share, measured_at, project_step
from workloads.core.errors import UsageError

__all__ = [
    "ALGORITHMS", "BOOTSTRAP", "GLOO_ALGORITHMS", "GLOO_FORM_OPS", "GLOO_MAX_SEGMENT", "MODEL_ONLY", "PI_LEVEL",
    "ROBUST_SCALE", "SCHEMA", "SEED", "SERIAL_UNSEEN", "WIRE_OP", "Point", "Projection", "StepProjection", "UsageError",
    "_blocks", "_by_size", "_call_size", "_cells", "attainable", "form_units", "form_words", "noise_lines",
    "noise_model", "parametric_draws", "prediction_errors", "schedule_floor", "_ends", "_group_op", "_noise", "_parse_time",
    "_price_calls", "_quantile", "_size", "block_of", "check_against", "left_out", "check_times", "problem", "check_summary", "code_of", "compare", "fabric_of",
    "fit", "fit_lines", "fit_op", "fit_params", "form_of", "gloo_ring", "gloo_segments", "holdout", "host_share",
    "label", "latency_floor", "load", "measured_at", "model_time", "noise_at", "op_time", "parse_ranks", "points",
    "project", "project_step", "projection_line", "select", "serial_segments", "step_line", "terms", "wire_op",
]
