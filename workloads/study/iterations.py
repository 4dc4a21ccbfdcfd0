"""What an earlier collectives run says of its measured window, for `window: auto` (window.py).

A collectives run times each (op, size, placement) cell as one block of `collectives.iters`
back-to-back calls (harness.py), so one more iteration adds one call of every cell to the run:

    t        = Σ over the record's timed cells of time_us       (one iteration of the whole sweep)
    window   = iters · t                                          (the run's measured time)

and O is what is left of the run's wall time (start-up, warm-up, the untimed first call per
cell, the check, the per-call samples, p2p, the record).

The primary metric (catalog: all_reduce's bus bandwidth at the largest size) is the mean busbw of
its row's timed cells, each bytes / (the mean of n calls), so its log varies within a run by
σ_call² / (P·n), P the row's timed placements (out-of-place, in-place). σ_call comes from the
row's per-call samples (`stability.times_us_by_rank`, `collectives.sample_iters` calls timed one
by one after the block; T(i) = the slowest rank's time in call i, the call's duration), their
logs in batches as for training steps (window.batch_var); so σ_w² per iteration = σ_call² / P.
The samples are timed one call at a time, the block back to back: where back-to-back calls
overlap (a GPU stream) the block varies less than this says, and the window chosen errs long.
"""

from __future__ import annotations

from typing import Callable

from workloads.study.window import Measured, batch_var, steps_of

# the window's key (catalog: Workload.window) -> what one of its units is called in the plan and the records
UNITS = {"train.steps": "step", "collectives.iters": "iteration", "load.num_requests": "request"}
WHAT = {"collectives.iters": " (one call of every op, size and placement)",
        "load.num_requests": " (one at every load point)"}
PER = {"load.num_requests": "load point"}   # what the window counts units of, when not the run
# keys that, set by a workload's overrides, pin its window too (a sweep run for a time, not a count)
PINS = {"load.num_requests": ("load.duration_s",)}


def unit(key: str) -> str:
    return UNITS.get(key, "step")


def reader(key: str, primary: Callable[[dict], str | None]) -> Callable[[dict], Measured | None]:
    """What one record of a workload whose window is `key` says of it; `primary(rec)` names the
    record's primary metric (the study's, else the workload's)."""
    if key == "collectives.iters":
        return lambda rec: iterations_of(rec, primary(rec))
    return steps_of


def primary_row(rows: list[dict], metric: str | None) -> dict | None:
    """The row the primary metric is read from: `<op>/busbw@<size>(GB/s)`'s op and size, or an
    op's avg_busbw when that op ran one size (its average is then that row's). None otherwise:
    an average over sizes has no one row's samples."""
    if not metric or "/" not in metric:
        return None
    op, name = metric.split("/", 1)
    mine = [r for r in rows if r.get("op") == op and _timed(r)]
    if name.startswith("busbw@"):
        try:
            size = int(name[len("busbw@"):].split("(")[0])
        except ValueError:
            return None
        mine = [r for r in mine if int(r.get("size") or -1) == size]
    elif name != "avg_busbw(GB/s)":
        return None
    return mine[0] if len(mine) == 1 else None


def _timed(row: dict) -> list[float]:
    return [c["time_us"] for c in (row.get("out_of_place"), row.get("in_place")) if c and c.get("time_us")]


def durations(stability: dict | None) -> list[float]:
    """Seconds of each sampled call: the slowest rank's time inside it (stability.py's T(i))."""
    by_rank = list(((stability or {}).get("times_us_by_rank") or {}).values())
    if not by_rank or any(len(t) != len(by_rank[0]) for t in by_rank):
        return []
    return [max(t[i] for t in by_rank) * 1e-6 for i in range(len(by_rank[0]))]


def iterations_of(rec: dict, metric: str | None) -> Measured | None:
    """A collectives record's window (module docstring); None when its primary row has too few
    per-call samples (collectives.sample_iters under 10, or sample_maxbytes below its size)."""
    rows = rec.get("rows") or []
    row = primary_row(rows, metric)
    iters = int(((rec.get("config") or {}).get("collectives") or {}).get("iters") or 0)
    if row is None or iters <= 0:
        return None
    times = [x for x in durations(row.get("stability")) if x > 0]
    var = batch_var(times)
    if var is None:
        return None
    step = sum(t for r in rows for t in _timed(r)) * 1e-6
    return Measured(var / len(_timed(row)), step, iters * step, iters)
