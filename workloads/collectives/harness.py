"""The one harness every collective runs through: warm-up, timing, checking, printing.

Per op (as nccl-tests' TimeTest / BenchTime):
  1. warm-up: `warmup_iters` calls at the largest and at the smallest size;
  2. per size and placement: one untimed call, a barrier, then `iters` calls timed as one
     block between two device synchronisations (t = block / iters), so per-call launch
     and timer overheads are amortised and GPU work is really finished;
  3. the per-rank times are combined over the whole job: mean by default (nccl-tests'
     -a 1), or min, max, or rank 0's;
  4. the check: fresh inputs, one call, the outputs compared with what they must be;
     the wrong-element counts of all ranks are summed.
The table matches nccl-tests' (size, count, type, redop, root, then time/algbw/busbw/
#wrong for out-of-place and in-place) and each op ends with nccl-tests' two footer lines.

Sizes whose rounded count is 0 (e.g. all_gather of 8 B over 8 ranks) are reported, not
skipped: nccl-tests' src/common.cu TimeTest calls BenchTime for every size of the sweep
in both placements, and each BenchTime ends with `bw[0] += busBw; bw_count[0]++`, so a
count-0 row prints size 0, count 0, busbw 0.00 and pulls "Avg bus bandwidth" down
(run() divides bw[0] by bw_count[0]). We do the same, except that the zero-element call
itself is not made (it moves no bytes; its time is launch overhead, and Gloo before
pytorch/gloo#356 aborted with SIGFPE on an empty all_gather): its time column is N/A.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.distributed as dist

from workloads.collectives import ops, stability
from workloads.collectives.settings import Checks, Faults, Sweep, Timing, float_str
from workloads.core import dist as fdist
from workloads.core.errors import UsageError


@dataclass
class Cell:
    time_us: float | None  # None: not timed (a count-0 row; see zero_cell)
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int | None  # None: not checked (printed N/A)
    pct_line_rate: float | None = None  # busbw as % of one communicator's line rate (multi-node runs; linerate.py)


@dataclass
class Row:
    op: str
    size: int  # bytes, the size column (after nccl-tests' rounding)
    requested: int  # bytes asked for
    count: int
    type: str
    redop: str
    root: int
    group_size: int
    out_of_place: Cell | None  # None: this placement is not measured (N/A)
    in_place: Cell | None
    stability: dict | None = None  # per-call samples across ranks (stability.py), rank 0 only

    def cells(self) -> list[Cell]:
        return [c for c in (self.out_of_place, self.in_place) if c is not None]

    def as_dict(self) -> dict:
        return asdict(self)


# Elements per slice of the correctness check (16 Mi: two float64 temporaries of 128 MiB).
CHECK_CHUNK = 1 << 24


def time_block(run: Callable[[], None], iters: int, device: torch.device) -> float:
    """Seconds per call: `iters` back-to-back calls between two device synchronisations."""
    fdist.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    fdist.synchronize(device)
    return (time.perf_counter() - t0) / iters


def time_each(run: Callable[[], None], n: int, device: torch.device, delay_s: float = 0.0) -> list[float]:
    """Seconds inside each of `n` calls: a CUDA event pair per call on GPU (the stream's own
    clock, so a call's wait for its peers is counted), the clock around the blocking call on
    CPU. `delay_s` is the straggler test hook (FABRICBENCH_TEST_SLOW_RANK): a sleep before each."""
    if device.type == "cuda":
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in pairs:
            if delay_s:
                time.sleep(delay_s)
            start.record()
            run()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1e3 for start, end in pairs]  # ms -> s
    out = []
    for _ in range(n):
        if delay_s:
            time.sleep(delay_s)
        t0 = time.perf_counter()
        run()
        out.append(time.perf_counter() - t0)
    return out


def zero_cell(check: bool) -> Cell:
    """A count-0 cell as nccl-tests reports it: algbw = busbw = 0 (0 bytes moved) and, when
    checking, 0 wrong elements (there are none to be wrong). The call is not made, so no time."""
    return Cell(None, 0.0, 0.0, 0 if check else None)


def count_wrong(got: torch.Tensor | None, want: torch.Tensor | None) -> int:
    if got is None or want is None:
        return 0
    if got.dtype.is_floating_point:
        # Inputs are small integers, so results are exact or off by rounding in the
        # last place (reduction order); a few ulps of slack, nothing more.
        tol = 8 * torch.finfo(got.dtype).eps
        ok = torch.isclose(got.double(), want.double(), rtol=tol, atol=0.0)
    else:
        ok = got == want
    return int((~ok).sum().item())


@dataclass(frozen=True)
class Communicators:
    """How the world is split into communicators, for a harness on one of them: every
    communicator's ranks (lateness is judged within each; None: the harness's own alone), the
    ranks per node, and the pattern's name, which only labels the header."""

    groups: list[list[int]] | None = None
    ranks_per_node: int = 1
    pattern: str = "all"


class Harness:
    """Times and checks one sweep (settings.py's Sweep, Timing, Checks) on one communicator.
    `faults` are the test hooks (none in a measurement)."""

    def __init__(self, sweep: Sweep, timing: Timing, checks: Checks, comm: ops.Comm, device: torch.device,
                 backend: str, world_rank: int, printer: Callable[[str], None] | None = None,
                 communicators: Communicators = Communicators(), faults: Faults = Faults()):
        self.sweep, self.timing, self.checks, self.faults = sweep, timing, checks, faults
        self.comm, self.device, self.backend, self.world_rank = comm, device, backend, world_rank
        self.pattern = communicators.pattern
        self.groups = communicators.groups or [list(comm.global_ranks)]  # every communicator, for lateness within each
        self.ranks_per_node = communicators.ranks_per_node
        self.line_rate: float | None = None  # GB/s per communicator (run.py sets it on multi-node runs); None: no %
        self.dtype = ops.DTYPES[sweep.datatype]
        self.type_size = torch.empty((), dtype=self.dtype).element_size()
        self.print = printer or (lambda line: None)

    # ---- job-wide reductions (over the world, as nccl-tests uses MPI_COMM_WORLD) ----
    def _world_reduce(self, value: float, how: str) -> float:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        if how == "rank0":
            dist.broadcast(t, src=0)
        else:
            op = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM,
                  "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[how]
            dist.all_reduce(t, op=op)
            if how == "mean":
                t /= dist.get_world_size()
        return float(t.item())

    def barrier(self) -> None:
        self._world_reduce(0.0, "sum")
        fdist.synchronize(self.device)

    # ---- one op ----
    def placements(self, op: ops.Collective) -> list[str]:
        wanted = [p for p, on in ((ops.OUT_OF_PLACE, self.sweep.out_of_place), (ops.IN_PLACE, self.sweep.in_place)) if on]
        return [p for p in wanted if p in op.placements]

    def _call(self, op: ops.Collective, b: ops.Buffers) -> Callable[[], None]:
        comm, redop, root = self.comm, self.sweep.redop, self.sweep.root
        return lambda: op.run(b, comm, redop, root)

    def _first_call(self, op: ops.Collective, run: Callable[[], None]) -> None:
        """The first call of an op: an unsupported op/dtype/redop surfaces here on every
        rank alike (the arguments are the same everywhere), so one clear error, no hang."""
        try:
            run()
        except (RuntimeError, ValueError, NotImplementedError, TypeError) as e:
            raise UsageError(
                f"{op.name} with datatype {self.sweep.datatype} and op {self.sweep.redop} is not supported by the "
                f"{self.backend} backend of torch {torch.__version__}: {str(e).splitlines()[0]}. Remove it from "
                "collectives.ops or change collectives.datatype / collectives.op."
            ) from None

    def warmup(self, op: ops.Collective) -> None:
        places = self.placements(op)
        if not places or self.timing.warmup_iters == 0:
            return
        for nbytes in {max(self.sweep.sizes), min(self.sweep.sizes)}:
            lay = op.layout(nbytes, self.type_size, self.comm.size)
            if lay.count == 0:
                continue
            b = op.buffers(lay, self.comm, self.sweep.root, self.dtype, self.device, places[0])
            run = self._call(op, b)
            self._first_call(op, run)
            for _ in range(self.timing.warmup_iters - 1):
                run()
        fdist.synchronize(self.device)

    def measure(self, op: ops.Collective, lay: ops.Layout, placement: str) -> Cell:
        root, comm, timing = self.sweep.root, self.comm, self.timing
        b = op.buffers(lay, comm, root, self.dtype, self.device, placement)
        run = self._call(op, b)
        self._first_call(op, run)
        self.barrier()
        seconds = self._world_reduce(time_block(run, timing.iters, self.device), timing.average)
        algbw, busbw = op.bandwidth(lay.size, seconds, comm.size)
        wrong = None
        if self.checks.elements:
            b = op.buffers(lay, comm, root, self.dtype, self.device, placement)
            self._call(op, b)()
            fdist.synchronize(self.device)
            if self.faults.corrupt == (self.world_rank, op.name) and b.checked is not None and b.checked.numel():
                b.checked.view(-1)[0] += 1  # test hook (FABRICBENCH_TEST_CORRUPT): one bad element
            wrong = int(self._world_reduce(float(self.count_wrong_in(op, lay, b)), "sum"))
        from workloads.fabric.linerate import pct

        return Cell(seconds * 1e6, algbw, busbw, wrong, pct(busbw, self.line_rate))

    def count_wrong_in(self, op: ops.Collective, lay: ops.Layout, b: ops.Buffers) -> int:
        """Wrong elements of this rank's output, compared CHECK_CHUNK elements at a time: the
        expected values and the float64 copies exist for one slice only, so the check fits
        beside the buffers at any size and rank count."""
        if b.checked is None:
            return 0
        got, wrong = b.checked.view(-1), 0
        for lo in range(0, got.numel(), CHECK_CHUNK):
            hi = min(got.numel(), lo + CHECK_CHUNK)
            want = op.expected_slice(lay, self.comm, self.sweep.root, self.sweep.redop, self.dtype, self.device, lo, hi)
            wrong += count_wrong(got[lo:hi], want)
        return wrong

    def run_op(self, op: ops.Collective) -> list[Row]:
        s = self.sweep
        if s.root >= self.comm.size and op.uses_root:
            raise UsageError(f"collectives.root={s.root} is not a rank of a {self.comm.size}-rank communicator")
        self.print_header(op)
        self.warmup(op)
        rows = []
        for nbytes in s.sizes:
            lay = op.layout(nbytes, self.type_size, self.comm.size)
            if lay.count == 0:  # reported with busbw 0 and averaged, as nccl-tests does (module docstring)
                cells = {p: zero_cell(self.checks.elements) for p in self.placements(op)}
            else:
                cells = {p: self.measure(op, lay, p) for p in self.placements(op)}
            row = Row(op=op.name, size=lay.size, requested=nbytes, count=lay.count, type=s.datatype,
                      redop=s.redop if op.uses_redop else "none", root=s.root if op.uses_root else -1,
                      group_size=self.comm.size, out_of_place=cells.get(ops.OUT_OF_PLACE),
                      in_place=cells.get(ops.IN_PLACE))
            self.print(format_row(row))
            rows.append(row)
        for row, nbytes in zip(rows, s.sizes):  # after every headline row: sampling never touches them
            row.stability = self.sample(op, op.layout(nbytes, self.type_size, self.comm.size))
        self.print_footer(rows)
        self.print_insight(rows)
        return rows

    # ---- per-call samples (stability.py): after the block timing, which stays the headline ----
    def sample(self, op: ops.Collective, lay: ops.Layout) -> dict | None:
        """`sample_iters` calls timed one by one on every rank, gathered to rank 0 (one
        all_gather per size); rank 0 returns the size's spread and straggler figures."""
        places, slow = self.placements(op), self.faults.slow_rank
        small = self.timing.sample_maxbytes is None or lay.size <= self.timing.sample_maxbytes
        if self.timing.sample_iters <= 0 or lay.count == 0 or not small or not places or not dist.is_initialized():
            return None  # (no process group: a harness driven by a unit test, nothing to call)
        b = op.buffers(lay, self.comm, self.sweep.root, self.dtype, self.device, places[0])
        run = self._call(op, b)
        delay = slow[1] if slow and slow[0] == self.world_rank else 0.0
        self.barrier()
        mine = time_each(run, self.timing.sample_iters, self.device, delay)
        times = {self.world_rank: mine}
        if dist.get_world_size() > 1:
            t = torch.tensor(mine, dtype=torch.float64, device=self.device)
            parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, t)
            times = {r: p.tolist() for r, p in enumerate(parts)}
        if self.world_rank != 0:
            return None
        return stability.size_stats(times, self.groups, self.ranks_per_node)

    # ---- printing (rank 0 passes a real printer) ----
    def print_header(self, op: ops.Collective) -> None:
        s, t = self.sweep, self.timing
        self.print(f"# Collective test starting: {op.name} (fabricbench, {self.backend}, "
                   f"{self.comm.size} ranks per communicator, pattern {self.pattern})")
        self.print(f"# minBytes {min(s.sizes)} maxBytes {max(s.sizes)} warmup iters: {t.warmup_iters} "
                   f"iters: {t.iters} validation: {int(self.checks.elements)} average: {t.average}")
        missing = [p for p in (ops.OUT_OF_PLACE, ops.IN_PLACE) if p not in op.placements]
        if missing:
            self.print(f"# {op.name}: torch.distributed has no {missing[0].replace('_', '-')} form; "
                       "those columns are N/A (not measured)")
        rounded = [(n, op.layout(n, self.type_size, self.comm.size).size) for n in s.sizes]
        rounded = [(a, b) for a, b in rounded if a != b]
        if rounded:
            shown = ", ".join(f"{a}->{b}" for a, b in rounded[:4]) + (" ..." if len(rounded) > 4 else "")
            self.print(f"# sizes rounded down as nccl-tests does for {op.name} at n={self.comm.size}: {shown}")
        zeros = [n for n in s.sizes if op.layout(n, self.type_size, self.comm.size).count == 0]
        if zeros:
            self.print(f"# {len(zeros)} size(s) up to {max(zeros)} B hold no whole {s.datatype} chunk per rank for "
                       f"{op.name} at n={self.comm.size}: printed as count 0, busbw 0 and counted in the average "
                       "(as nccl-tests); not called, so time N/A")
        self.print("#")
        self.print(HEADER)

    def print_footer(self, rows: list[Row]) -> None:
        summary = summarize(rows)
        bad = summary["rows_with_wrong"]
        self.print(f"# {'Out of bounds values':<20} : {bad} {'FAILED' if bad else 'OK'}")
        self.print(f"# {'Avg bus bandwidth':<20} : {summary['avg_busbw']:g} {min_bw_verdict(summary['avg_busbw'], self.checks.min_busbw)}")
        self.print("#")


    def print_insight(self, rows: list[Row]) -> None:
        """Beside nccl-tests' table, never inside it: % of line rate and the per-call spread."""
        sampled = [r for r in rows if r.stability and r.stability.get("samples")]
        if not sampled and self.line_rate is None:
            return
        self.print(f"# {rows[0].op if rows else ''}: % of line rate"
                   + (f" ({self.line_rate:g} GB/s per communicator)" if self.line_rate else " (n/a)")
                   + f" and {self.timing.sample_iters} calls per size timed one by one after the block "
                   "(p50/p95/p99 of the slowest rank's time, CV, the latest rank)")
        self.print(f"# {'size':>10}  {'busbw':>7}  {'%line':>6}  {'p50(us)':>9}  {'p95(us)':>9}  {'p99(us)':>9}  "
                   f"{'cv':>5}  verdict")
        for r in rows:
            cells = r.cells()
            busbw = max((c.busbw for c in cells), default=0.0)
            pcts = [c.pct_line_rate for c in cells if c.pct_line_rate is not None]
            st = r.stability or {}
            if st.get("samples"):
                spread = f"{st['p50(us)']:9.1f}  {st['p95(us)']:9.1f}  {st['p99(us)']:9.1f}  {st['cv']:5.2f}"
            else:
                spread = f"{'N/A':>9}  {'N/A':>9}  {'N/A':>9}  {'N/A':>5}"
            pct = f"{max(pcts):6.1f}" if pcts else f"{'n/a':>6}"
            self.print(f"# {r.size:>10}  {float_str(busbw, 7)}  {pct}  {spread}  {stability.verdict_line(st)}")
        self.print("#")


HEADER = "\n".join([
    f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}           out-of-place                       in-place          ",
    f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  "
    f"{'#wrong':>6}  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}",
    f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  "
    f"{'':>6}  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}",
])


def format_cell(c: Cell | None) -> str:
    if c is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
    wrong = f"{'N/A':>6}" if c.wrong is None else f"{c.wrong:6d}"
    time = f"{'N/A':>7}" if c.time_us is None else float_str(c.time_us, 7)
    return f"  {time}  {float_str(c.algbw, 6)}  {float_str(c.busbw, 6)}  {wrong}"


def format_row(r: Row) -> str:
    return (f"{r.size:12d}  {r.count:12d}  {r.type:>8}  {r.redop:>6}  {r.root:6d}"
            + format_cell(r.out_of_place) + format_cell(r.in_place))


def summarize(rows: list[Row]) -> dict:
    """nccl-tests' footer figures: mean busbw over every reported cell (count-0 rows
    included, at busbw 0, as common.cu's bw[0] / bw_count[0]; N/A placements, which torch
    cannot run, are not reported), and the number of cells with wrong elements."""
    cells = [c for r in rows for c in r.cells()]
    busbw = [c.busbw for c in cells]
    return {
        "avg_busbw": sum(busbw) / len(busbw) if busbw else 0.0,
        "peak_busbw": max(busbw) if busbw else 0.0,
        "rows_with_wrong": sum(1 for c in cells if c.wrong),
        "wrong_elements": sum(c.wrong or 0 for c in cells),
        "cells": len(cells),
    }


def min_bw_verdict(avg: float, min_busbw: float | None) -> str:
    """As NCCL_TESTS_MIN_BW: the run fails when the average is below 0.9 x the minimum."""
    if min_busbw is None:
        return ""
    return "FAILED" if avg < 0.9 * min_busbw else "OK"
