"""How long each run of a study measures: the window that reaches the asked power in the least
wall time, from what earlier runs of the workload cost and how they varied.

A run of n measured steps costs O + n·t seconds (O: everything outside the window, start-up,
warm-up and the record; t: one step) and its log metric varies between runs by
CV(n)² = σ_b² + σ_w²/n: σ_b the run-to-run part no window removes (placement, the fabric's
state, the run's own start), σ_w the step-to-step part that averaging over n steps shrinks.
The blocks a study needs grow with CV(n)², so its wall time is about

    blocks(CV(n)) · Σ_arms (O + n·t)

and the best window balances the two: without the integer block count, (σ_b² + σ_w²/n)(O + n·t)
is least at n* = sqrt(σ_w²·O / (σ_b²·t)). The plan evaluates the integer block count
(analysis.stats.blocks_for) at every n from a short window to a long one and keeps the n with the
least wall time; a longer window than needed is never bought when it does not save a block.

Where the numbers come from, for a workload with per-step samples (training: samples.step_time_s
after the warm-up; a collectives run's iterations: workloads/study/iterations.py): t the median
measured step; σ_w from batch means of the steps' logs (five batches, so steps that drift
together are not counted as independent); O the median wall time of the runs (the study's
timings.jsonl) less their measured window; σ_b from the block CV the plan measured (its upper
limit for the block count), less the σ_w²/n that window contributed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Callable

MIN_STEPS, MAX_STEPS = 5, 2000
BATCHES = 5
FLOOR = 0.005  # no run is noise-free: the plan's CV floor (plan.py), here for σ_b


@dataclass(frozen=True)
class Costs:
    """What one run of the workload costs and how it varies (see the module docstring)."""

    overhead_s: float   # O
    step_s: float       # t
    between: float      # σ_b
    within: float       # σ_w
    steps_before: int   # the measured steps of the runs these came from
    # 80% upper limits of σ_b and σ_w (costs_from, from the block CV's and σ_w's own); NaN: unknown
    between_up: float = math.nan
    within_up: float = math.nan

    def cv(self, n: int) -> float:
        return math.sqrt(self.between ** 2 + self.within ** 2 / n)

    def cv_up(self, n: int) -> float:
        """CV(n) at the upper limits: what the blocks are counted on and the MDE printed at."""
        return math.sqrt(self.between_up ** 2 + self.within_up ** 2 / n)

    def sized(self, n: int, upper_ratio: float = 1.0) -> float:
        """The CV a window of n is sized on: cv_up(n) where the limits are known, else CV(n) x the
        ratio of the measured CV's upper limit to its estimate."""
        up = self.cv_up(n)
        return up if math.isfinite(up) else self.cv(n) * upper_ratio

    def run_s(self, n: int) -> float:
        return self.overhead_s + n * self.step_s

    def duty(self, n: int) -> float:
        return n * self.step_s / self.run_s(n)

    def unconstrained(self) -> float:
        """n* of the continuous problem (the module docstring)."""
        if self.between <= 0 or self.step_s <= 0:
            return math.inf
        return math.sqrt(self.within ** 2 * self.overhead_s / (self.between ** 2 * self.step_s))


@dataclass(frozen=True)
class Choice:
    steps: int
    blocks: int
    wall_s: float       # the study's runs of this workload, every arm
    duty: float         # measured time / wall time of a run
    cv: float


def choose(costs: Costs, detect: float, tests: int, alpha: float, arms: int, looks: int = 1,
           upper_ratio: float = 1.0, lo: int = MIN_STEPS, hi: int = MAX_STEPS) -> Choice | None:
    """The window (measured steps) and blocks with the least wall time that reach 80% power at
    `detect` over `tests` verdicts; blocks are counted on CV(n)·upper_ratio (the plan's upper
    limit of a measured CV over its estimate). None: no window up to `hi` can call `detect`.
    Never shorter than the window the noise was measured at (`floor`)."""
    from analysis import stats

    lo = floor(costs, lo)

    def reachable(n: int) -> bool:  # within blocks_for's 200 blocks: one MDE, not 200
        return stats.plan_mde(200, tests, costs.sized(n, upper_ratio), alpha, looks) <= detect

    if not reachable(hi):
        return None
    first = hi
    while lo < first:  # the shortest window that can call it at all (CV(n) falls with n)
        mid = (lo + first) // 2
        lo, first = (lo, mid) if reachable(mid) else (mid + 1, first)
    best: Choice | None = None
    for n in _grid(first, hi):
        k = stats.blocks_for(detect, tests, costs.sized(n, upper_ratio), alpha, looks)
        if k is None:
            continue
        wall = k * arms * costs.run_s(n)
        if best is None or wall < best.wall_s - 1e-9:
            best = Choice(n, k, wall, costs.duty(n), costs.cv(n))
    return best


def shortest(costs: Costs, blocks: int, detect: float, tests: int, alpha: float, looks: int = 1,
             upper_ratio: float = 1.0, lo: int = MIN_STEPS, hi: int = MAX_STEPS) -> int | None:
    """The fewest measured steps that call `detect` in `blocks` blocks (CV(n) falls as n grows, so
    the blocks needed never rise with n: bisection). None: not even `hi` steps do. Never shorter
    than the window the noise was measured at (`floor`)."""
    from analysis import stats

    lo = floor(costs, lo)

    def enough(n: int) -> bool:
        k = stats.blocks_for(detect, tests, costs.sized(n, upper_ratio), alpha, looks)
        return k is not None and k <= blocks

    if not enough(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


def floor(costs: Costs, lo: int = MIN_STEPS) -> int:
    """The shortest window a plan may choose: the one its earlier runs measured. CV(n)² =
    σ_b² + σ_w²/n is measured at that window and only extrapolated below it, where a window holds a
    larger share of the run's least steady steps (those right after the warm-up) and of whatever
    a window pays once; and there it failed: an emulated study's training, measured at 15 steps
    and cut to 5 by the plan, varied by a block log-ratio sd of 0.31 and 0.35 where the model
    gave 0.11 and 0.10 (docs/studies.md). Longer windows only dilute those, so the plan may lengthen a window,
    not shorten it: to let it choose short windows, measure the earlier runs at one."""
    return max(lo, costs.steps_before)


def _grid(lo: int, hi: int) -> list[int]:
    """Every n up to 50, then steps of ~5%: the wall time is flat near its least."""
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n = n + 1 if n < 50 else int(math.ceil(n * 1.05))
    return out


@dataclass(frozen=True)
class Measured:
    """What one earlier run says of its window: the within-run variance of its primary metric per
    step and what a step costs (a training step; for collectives an iteration, workloads/study/iterations.py)."""

    within2: float      # σ_w² per step: the log primary's variance that a window of n steps divides by n
    step_s: float       # t: the wall seconds one more step adds to the run
    window_s: float     # the run's measured time
    steps: int          # its measured steps


def batch_var(samples: list, stat: Callable[[list], float | None] | None = None) -> float | None:
    """σ² per sample of a statistic's log, from BATCHES consecutive batches of the samples (samples
    that drift together are not counted as independent): var(the batches' log statistic) x batch
    size, what a statistic over n samples then varies by, divided by n. `stat`: a batch's
    statistic, the one the run's metric takes over all its samples (an inference point's median
    TTFT: workloads/study/served.py); by default the mean of the samples' logs. None for fewer
    than BATCHES·2 samples, or a batch whose statistic is not positive."""
    if len(samples) < 2 * BATCHES:
        return None
    size = len(samples) // BATCHES
    batches = [samples[i * size:(i + 1) * size] for i in range(BATCHES)]
    if stat is None:
        means = [sum(math.log(x) for x in b) / size for b in batches]
    else:
        got = [stat(b) for b in batches]
        if any(x is None or not x > 0 for x in got):
            return None
        means = [math.log(x) for x in got]
    grand = sum(means) / BATCHES
    return sum((m - grand) ** 2 for m in means) / (BATCHES - 1) * size


def steps_of(rec: dict) -> Measured | None:
    """A training record's measured steps (samples.step_time_s after the warm-up)."""
    s = rec.get("samples") or {}
    times = [float(x) for x in (s.get("step_time_s") or [])[int(s.get("warmup_steps") or 0):] if x and x > 0]
    var = batch_var(times)
    return None if var is None else Measured(var, median(times), sum(times), len(times))


def summarize(measured: list[Measured | None], run_seconds: list[float]) -> tuple[float, float, int, float] | None:
    """(t, σ_w, measured steps, O) over earlier runs: the median step, σ_w pooled, the median
    window, and O the median run's wall time less the median window; None without a run that
    has samples enough or without run times."""
    got = [m for m in measured if m is not None]
    if not got or not run_seconds:
        return None
    overhead = max(median(run_seconds) - median(m.window_s for m in got), 0.0)
    return (median(m.step_s for m in got), math.sqrt(sum(m.within2 for m in got) / len(got)),
            int(median(m.steps for m in got)), overhead)


def step_costs(records: list[dict], run_seconds: list[float]) -> tuple[float, float, int, float] | None:
    """(t, σ_w, measured steps, O) from ok training records of one workload (their per-step
    samples) and the wall seconds of their runs; None without at least BATCHES·2 measured steps in a record."""
    return summarize([steps_of(rec) for rec in records], run_seconds)


def costs_from(records: list[dict], run_seconds: list[float], block_cv: float | None,
               read: Callable[[dict], Measured | None] = steps_of, block_upper: float | None = None) -> Costs | None:
    """Costs of a workload from its earlier runs (`read`: what one record says of its window);
    σ_b from the block CV measured at their window (None: the plan has no measured CV, and then
    no window is chosen from a guess).

    With the block CV's 80% upper limit (`block_upper`), the limits of CV(n) at every window:
    σ_w's own (BATCHES - 1 df a run, pooled), and σ_b,up² = block_upper² - σ_w,lo²/n0 (the block
    CV's upper limit less the least the window could have contributed). σ_b is a difference of two
    estimates and the plan lengthens the window exactly where it looks small, so a window chosen
    on the estimates, or on the block CV's ratio at n0, is sized on a CV(n) biased low."""
    measured = [m for m in (read(rec) for rec in records) if m is not None]
    got = summarize(measured, run_seconds)
    if got is None or block_cv is None:
        return None
    t, sw, n, overhead = got
    between = math.sqrt(max(block_cv ** 2 - sw ** 2 / n, FLOOR ** 2))
    if block_upper is None:
        return Costs(overhead, t, between, sw, n)
    from scipy import stats as sps

    df = (BATCHES - 1) * len(measured)
    sw_lo, sw_up = (sw * math.sqrt(df / sps.chi2.ppf(q, df)) for q in (0.8, 0.2))
    between_up = math.sqrt(max(block_upper ** 2 - sw_lo ** 2 / n, FLOOR ** 2, between ** 2))
    return Costs(overhead, t, between, sw, n, between_up, sw_up)


def run_seconds(folder: Path, names: set[str]) -> list[float]:
    """The wall seconds of the ok runs of workloads `names` in a study folder (timings.jsonl)."""
    try:
        lines = (folder / "timings.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            t = json.loads(line)
        except json.JSONDecodeError:
            continue
        if t.get("workload") in names and t.get("ok"):
            out.append(float(t["seconds"]))
    return out
