"""A run's collectives as the replay workload reads them: from a fabricbench training record, or
from a PyTorch Flight Recorder dump.

A training record keeps, per timed step, the collectives its ranks launched (CommTimer, rank 0):
`samples.comm_calls` = [[op, dtype, elements sent, ranks in the group, start s, end s], ...] per
step, times from the step's start. A Flight Recorder dump (`_dump_fr_trace_json`, or the file
TORCH_FR_DUMP_TEMP_FILE names; the same JSON from Gloo and NCCL) has no steps: its `entries`
are one sequence, each with `profiling_name` ("gloo:all_reduce", "nccl:_allgather_base"),
`input_sizes`, `input_dtypes`, `process_group` and `time_created_ns`; the whole dump is replayed
as one step, paced by the creation times (an entry's end is not recorded there on Gloo).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from workloads.core.errors import UsageError

# torch.distributed's function (or Flight Recorder's name for it) -> the op replay runs
OPS = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "broadcast": "broadcast", "reduce": "reduce",
    "all_gather_into_tensor": "all_gather", "_allgather_base": "all_gather", "all_gather": "all_gather",
    "allgather": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "alltoall", "alltoall_base": "alltoall", "all_to_all": "alltoall", "alltoall": "alltoall",
}
# Flight Recorder's dtype names (c10's ScalarType) -> torch's
FR_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Int": "int32",
             "Long": "int64", "Byte": "uint8", "Char": "int8", "Bool": "bool"}
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8")


@dataclass(frozen=True)
class Call:
    op: str                  # all_reduce | broadcast | reduce | all_gather | reduce_scatter | alltoall
    dtype: str               # torch's name: float32, bfloat16, ...
    numel: int               # elements this rank sends (an all_gather's input, a reduce_scatter's input)
    group_size: int          # ranks in its group when captured
    start_s: float | None    # launch time from the step's start
    end_s: float | None      # completion time from the step's start (None: not recorded)


@dataclass(frozen=True)
class Trace:
    source: str              # "record" | "flight-recorder"
    path: str
    steps: tuple[tuple[Call, ...], ...]
    world: int               # ranks of the captured run
    comm_time_s: tuple[float, ...] | None   # the captured run's own comm time per step (a record's)
    step_time_s: tuple[float, ...] | None

    @property
    def bytes_per_step(self) -> float:
        """Bytes this rank sends per step, the mean over the trace's steps."""
        return sum(c.numel * _itemsize(c.dtype) for s in self.steps for c in s) / max(1, len(self.steps))


def _itemsize(dtype: str) -> int:
    return {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 1)


def load(path: str | Path) -> Trace:
    """The trace in `path` (a record or a Flight Recorder dump), or a UsageError naming what is wrong."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"replay.trace={path}: no such file; give a training record (results/<run>/records/"
                         "pretrain-*.json) or a Flight Recorder JSON dump") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"replay.trace={path}: not JSON ({e.__class__.__name__}); give a training record or a "
                         "Flight Recorder JSON dump") from None
    if isinstance(doc, dict) and "entries" in doc:
        return _from_flight_recorder(doc, str(p))
    if isinstance(doc, dict) and "samples" in doc:
        return _from_record(doc, str(p))
    raise UsageError(f"replay.trace={path}: neither a fabricbench training record (samples.comm_calls) nor a "
                     "Flight Recorder dump (entries)")


def _from_record(rec: dict, path: str) -> Trace:
    calls = (rec.get("samples") or {}).get("comm_calls")
    if not calls:
        raise UsageError(f"replay.trace={path}: the record holds no collectives trace (samples.comm_calls); it was "
                         "made before traces were kept, or its run had no timed step: rerun the training point")
    steps = []
    for step in calls:
        mine = []
        for op, dtype, numel, size, a, b in step:
            if op not in OPS or dtype not in DTYPES or not numel:
                continue
            mine.append(Call(OPS[op], dtype, int(numel), int(size), a, b))
        steps.append(tuple(mine))
    if not any(steps):
        raise UsageError(f"replay.trace={path}: its trace holds no collective replay can run (ops: "
                         f"{sorted({c[0] for s in calls for c in s})})")
    s = rec.get("samples") or {}
    warm = int(s.get("warmup_steps") or 0)
    comm = s.get("comm_time_s")
    step = s.get("step_time_s")
    n = len(steps)
    return Trace("record", path, tuple(steps), int((rec.get("world") or {}).get("world_size") or 0),
                 tuple(comm[warm:warm + n]) if comm else None, tuple(step[warm:warm + n]) if step else None)


def _from_flight_recorder(doc: dict, path: str) -> Trace:
    entries = [e for e in doc.get("entries") or [] if not e.get("is_p2p")]
    groups = {str(k): v for k, v in (doc.get("pg_config") or {}).items()}
    out, t0 = [], None
    sizes = set()
    for e in sorted(entries, key=lambda e: (e.get("time_created_ns") or 0, e.get("record_id") or 0)):
        name = str(e.get("profiling_name") or "").split(":")[-1]
        if name not in OPS:
            continue
        dims = (e.get("input_sizes") or [[]])[0]
        dtype = FR_DTYPES.get(str((e.get("input_dtypes") or ["?"])[0]))
        if dtype is None or dtype not in DTYPES:
            continue
        ranks = _ranks(groups, e.get("process_group"))
        sizes.add(ranks)
        t = e.get("time_created_ns")
        t0 = t if t0 is None and t else t0
        out.append(Call(OPS[name], dtype, math.prod(dims) if dims else 1, ranks,
                        None if not t or t0 is None else (t - t0) / 1e9, None))
    if not out:
        raise UsageError(f"replay.trace={path}: the Flight Recorder dump has no collective replay can run "
                         "(set TORCH_FR_BUFFER_SIZE before the process group starts, and dump after the steps)")
    return Trace("flight-recorder", path, (tuple(out),), max(sizes), None, None)


def _ranks(groups: dict, pg) -> int:
    """Ranks in the entry's process group: pg_config's `ranks` ("[0, 1]" or "all"); 0 when unknown."""
    name = str(pg[1] if isinstance(pg, (list, tuple)) and len(pg) > 1 else pg or "")
    cfg = groups.get(name) or groups.get(str(pg[0]) if isinstance(pg, (list, tuple)) and pg else "") or \
        (next(iter(groups.values())) if len(groups) == 1 else {})
    ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
    try:
        return len(json.loads(ranks)) if isinstance(ranks, str) else len(ranks or [])
    except (ValueError, TypeError):
        return 0


def union_s(calls: tuple[Call, ...]) -> float | None:
    """Seconds with at least one of the calls in flight (None when an end is missing)."""
    from workloads.training.commtimer import union_length

    if not calls or any(c.start_s is None or c.end_s is None for c in calls):
        return None
    return union_length([(c.start_s, c.end_s) for c in calls])
