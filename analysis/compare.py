"""Points, and each fabric against the baseline at every point the guard allows.

A point is a set of runs with equal identity (analysis/guard.py): same everything but
the fabric. Its runs are grouped by fabric; each group's records are the trials.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Iterable

from analysis import guard, stats
from analysis.load import Run, Table
from workloads.core.errors import UsageError

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
    unmatched: list[Point] = field(default_factory=list)  # points neither compared nor a near miss

    def unmatched_summary(self) -> str | None:
        """One line counting the points that had no counterpart, or None when there are none."""
        n = len(self.unmatched)
        if not n:
            return None
        return (f"{n} point{'s' if n != 1 else ''} had no counterpart in another fabric (or no {self.baseline} run to "
                f"compare with); --verbose lists them")

    def unmatched_lines(self) -> list[str]:
        return [f"{p.label}: only {', '.join(p.by_fabric)} ({len(p.runs)} record{'s' if len(p.runs) != 1 else ''})"
                for p in self.unmatched]


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
    refusals, matched = near_misses(pts, base, fabrics, allow)
    unmatched = [p for p in pts if id(p) not in matched and not any(q is p for q, _ in comparisons)]
    return Result(pts, comparisons, refusals, base, allow, unmatched)


def near_misses(pts: list[Point], base: str | None, fabrics: list[str], allow: tuple[str, ...]) -> tuple[list[guard.Refusal], set[int]]:
    """Refusals worth showing, and the ids of the points they cover.

    A near miss is the comparison the user most likely meant: for the baseline and one other
    fabric F, a point the baseline reached without F and a point F reached without the
    baseline, of the same workload, each the other's nearest (same sweep coordinates first,
    then fewest differing identity keys; mutual, so one stray point is not paired with a
    whole sweep). Once the two fabrics share any point, only pairs at the same sweep
    coordinates (model, parallel, GPUs, batch, load point) are near misses: an mb=1 run only
    F made is a point F alone ran, not a confounded twin of the baseline's mb=8. Every other
    unmatched point is counted, not paired: naming its nearest unrelated record only buries
    the real misses.
    """
    refusals: list[guard.Refusal] = []
    matched: set[int] = set()
    for other in (f for f in fabrics if f != base):
        mine = [p for p in pts if base in p.by_fabric and other not in p.by_fabric]
        theirs = [q for q in pts if other in q.by_fabric and base not in q.by_fabric]
        rec = lambda p, f: p.by_fabric[f][0].record  # noqa: E731
        shared = any(base in p.by_fabric and other in p.by_fabric for p in pts)
        dist = {(i, j): (p.label != q.label, len(guard.differences(rec(p, base), rec(q, other), allow)))
                for i, p in enumerate(mine) for j, q in enumerate(theirs)
                if p.runs[0].workload == q.runs[0].workload and (p.label == q.label or not shared)}
        for (i, j), d in sorted(dist.items()):
            best_i = min(v for (a, _), v in dist.items() if a == i)
            best_j = min(v for (_, b), v in dist.items() if b == j)
            if d == best_i == best_j:
                ref = guard.check(rec(mine[i], base), rec(theirs[j], other), allow)
                if ref is not None:
                    refusals.append(ref)
                    matched |= {id(mine[i]), id(theirs[j])}
    return refusals, matched
