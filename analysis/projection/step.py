"""Training: a record's step time at other scales, its traced collectives priced by the calibration."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analysis.projection.forms import op_time
from analysis.projection.project import project
from analysis.projection.records import code_of, fabric_of
from workloads.core.errors import UsageError


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


def training_inputs(cal: dict[str, Any], rec: dict[str, Any]) -> tuple[list, dict[str, Any], int, float, float]:
    """A training record's traced calls, metrics, ranks, step time and time with a collective in
    flight, once it is checked to be an ok training record of the calibration's fabric and code."""
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
    step = float(m["iteration_time(s)"])
    return calls, m, p0, step, float(m["comm_share"]) * step


def project_step(cal: dict[str, Any], rec: dict[str, Any], p: int) -> StepProjection:
    """A training record's step time at p ranks: the time with no collective in flight stays
    (compute the communication did not overlap), and the time with one in flight (CommTimer's,
    overlap included) scales as the calibrated model's time of the step's own collectives (the
    record's trace) at p over its time at the record's scale (as the calibration's sweep measured
    it there, when it did: measured_at). The interval: each call's 90% PI at p, and the record's
    step-to-step spread (z x sd / sqrt(steps)); its low end also drops what the record's calls
    spent beyond the sweep's time for them (waiting for a peer or the host)."""
    from scipy import stats

    calls, m, p0, step, comm = training_inputs(cal, rec)
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
