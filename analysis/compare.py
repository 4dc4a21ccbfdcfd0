"""Points, and each fabric against the baseline at every point the guard allows.

A point is a set of runs with equal identity (analysis/guard.py): same everything but
the fabric. Its runs are grouped by fabric; each group's records are the trials.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable

from analysis import guard, stats
from analysis.load import Run, Table
from workloads.errors import UsageError

# Headline metrics per workload: (record metric key or fnmatch pattern over the record's
# metrics). A registry, so a new workload adds a line here, not a branch. Collectives: one
# headline per op ("all_reduce/avg_busbw(GB/s)"); the record's plain avg_busbw(GB/s) averages
# across ops (all_reduce blended with sendrecv and alltoall), which is no op's bandwidth.
METRICS: dict[str, list[str]] = {
    "pretrain": ["samples_per_sec"],
    "finetune": ["samples_per_sec"],
    "collectives": ["*/avg_busbw(GB/s)"],
    "inference": ["request_throughput", "median_ttft_ms", "p99_ttft_ms"],
}

# Which way is better, and the verdict's word: "faster" for times and rates, "better" for
# the rest (a smaller comm share or loss is not speed). First match wins, so the specific
# names come before the unit rules. A metric matching nothing is refused, not guessed.
DIRECTIONS: list[tuple[str, bool, str]] = [  # (fnmatch pattern, higher is better, word)
    ("*send_lag_ms", False, "better"),           # the client's own lateness, not the fabric's speed
    ("iteration_time_std(s)", False, "better"),  # spread of step times, not speed
    ("*_ms", False, "faster"), ("*(s)", False, "faster"), ("*(us)", False, "faster"),
    ("duration", False, "faster"),               # seconds a load point took
    ("*(GB/s)", True, "faster"), ("*(MB/s)", True, "faster"), ("*_per_sec", True, "faster"),
    ("*_throughput", True, "faster"), ("request_goodput", True, "faster"), ("tflops_per_gpu", True, "faster"),
    ("mfu", True, "better"), ("completed", True, "better"),
    ("comm_share", False, "better"), ("final_loss", False, "better"), ("loss", False, "better"),
    ("failed", False, "better"), ("warmup_failed", False, "better"),
    ("wrong_elements", False, "better"), ("rows_with_wrong", False, "better"),
]


def direction(metric: str) -> tuple[bool, str]:
    """(higher is better, verdict word) of a metric; UsageError when it has no known direction."""
    for pattern, hib, word in DIRECTIONS:
        if metric == pattern or fnmatchcase(metric, pattern):
            return hib, word
    raise UsageError(f"--metric {metric}: no known direction (is higher or lower better?); compare a metric with "
                     f"a unit suffix (_ms, (s), (us), (GB/s), _per_sec, _throughput) or add it to DIRECTIONS in "
                     f"analysis/compare.py")


def higher_is_better(metric: str) -> bool:
    return direction(metric)[0]


def headline(workload: str, names: Iterable[str]) -> list[str]:
    """The workload's headline metrics present in `names`, patterns expanded, in registry order."""
    names = sorted(set(names))
    out: list[str] = []
    for pattern in METRICS.get(workload, []):
        out += [n for n in names if (n == pattern or fnmatchcase(n, pattern)) and n not in out]
    return out


@dataclass
class Point:
    key: tuple
    runs: list[Run]

    @property
    def by_fabric(self) -> dict[str, list[Run]]:
        out: dict[str, list[Run]] = defaultdict(list)
        for r in self.runs:
            out[r.fabric].append(r)
        return dict(sorted(out.items()))

    @property
    def label(self) -> str:
        r = self.runs[0]
        c = r.coords
        parts = [r.workload, r.model, r.parallel]
        for k, short in (("world_size", "gpus"), ("global_batch", "batch"), ("micro_batch", "mb")):
            if k in c:
                parts.append(f"{short}={c[k]:g}")
        parts.append(r.point)  # inference: "c32", "poisson-r8-max64" (None elsewhere)
        return " ".join(str(p) for p in parts if p)


def points(table: Table, allow: Iterable[str] = ()) -> list[Point]:
    allow = tuple(allow)
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in table.ok():
        groups[guard.point_key(r.record, allow)].append(r)
    return sorted((Point(k, v) for k, v in groups.items()), key=lambda p: (p.runs[0].workload, sorted(p.runs[0].coords.items())))


@dataclass
class Result:
    points: list[Point]
    comparisons: list[tuple[Point, stats.Comparison]]
    refusals: list[guard.Refusal]
    baseline: str | None
    allow: tuple[str, ...] = ()   # identity keys declared allowed to differ (capacity groups sweeps with it)


def compare_table(table: Table, baseline: str | None = None, allow: Iterable[str] = (), metrics: Iterable[str] | None = None,
                  alpha: float = 0.05) -> Result:
    allow = tuple(allow)
    metrics = list(metrics or [])
    for m in metrics:
        direction(m)  # an unknown direction is refused before anything is compared
    pts = points(table, allow)
    fabrics = sorted({r.fabric for r in table.ok()})
    base = baseline or (fabrics[0] if fabrics else None)
    comparisons: list[tuple[Point, stats.Comparison]] = []
    for p in pts:
        groups = p.by_fabric
        if base not in groups or len(groups) < 2:
            continue
        wl = p.runs[0].workload
        wanted = list(metrics) if metrics else headline(wl, (m for r in p.runs for m in r.metrics))
        for metric in wanted:
            hib, word = direction(metric)
            base_vals = [v for r in groups[base] if (v := r.metric(metric)) is not None]
            for fabric, runs in groups.items():
                vals = [v for r in runs if (v := r.metric(metric)) is not None]
                if fabric == base or not vals or not base_vals:
                    continue
                comparisons.append((p, stats.compare(vals, base_vals, fabric, base, metric, hib, alpha=alpha, word=word)))
    # A point that only one fabric reached: say which keys keep it from its nearest neighbour.
    refusals: list[guard.Refusal] = []
    seen: set[frozenset] = set()
    for p in pts:
        if len(p.by_fabric) > 1:
            continue
        me = p.runs[0]
        others = [q.runs[0] for q in pts if q is not p and q.runs[0].workload == me.workload
                  and any(f != me.fabric for f in q.by_fabric)]
        others = [o for o in others if o.fabric != me.fabric] or others
        if not others:
            continue
        near = min(others, key=lambda o: len(guard.differences(me.record, o.record, allow)))
        pair = frozenset((id(me), id(near)))
        ref = guard.check(me.record, near.record, allow)
        if ref is not None and near.fabric != me.fabric and pair not in seen:
            seen.add(pair)
            refusals.append(ref)
    return Result(pts, comparisons, refusals, base, allow)
