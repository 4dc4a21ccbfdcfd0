"""Points, and each fabric against the baseline at every point the guard allows.

A point is a set of runs with equal identity (analysis/guard.py): same everything but
the fabric. Its runs are grouped by fabric; each group's records are the trials.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from analysis import guard, stats
from analysis.load import Run, Table

# Headline metrics per workload: (record metric key, higher is better). A registry, so a
# new workload adds a line here, not a branch.
METRICS: dict[str, list[tuple[str, bool]]] = {
    "pretrain": [("samples_per_sec", True)],
    "finetune": [("samples_per_sec", True)],
    "collectives": [("avg_busbw(GB/s)", True)],
    "inference": [("request_throughput", True), ("median_ttft_ms", False), ("p99_ttft_ms", False)],
}
LOWER_IS_BETTER_SUFFIXES = ("_ms", "(s)", "(us)")


def higher_is_better(metric: str) -> bool:
    for ms in METRICS.values():
        for name, hib in ms:
            if name == metric:
                return hib
    return not metric.endswith(LOWER_IS_BETTER_SUFFIXES)


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
        for k, short in (("world_size", "gpus"), ("global_batch", "batch"), ("micro_batch", "mb"),
                         ("concurrency", "conc"), ("rate", "rate")):
            if k in c:
                parts.append(f"{short}={c[k]:g}")
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


def compare_table(table: Table, baseline: str | None = None, allow: Iterable[str] = (), metrics: Iterable[str] | None = None,
                  alpha: float = 0.05) -> Result:
    allow = tuple(allow)
    pts = points(table, allow)
    fabrics = sorted({r.fabric for r in table.ok()})
    base = baseline or (fabrics[0] if fabrics else None)
    comparisons: list[tuple[Point, stats.Comparison]] = []
    for p in pts:
        groups = p.by_fabric
        if base not in groups or len(groups) < 2:
            continue
        wl = p.runs[0].workload
        wanted = [(m, higher_is_better(m)) for m in metrics] if metrics else METRICS.get(wl, [])
        for metric, hib in wanted:
            base_vals = [v for r in groups[base] if (v := r.metric(metric)) is not None]
            for fabric, runs in groups.items():
                vals = [v for r in runs if (v := r.metric(metric)) is not None]
                if fabric == base or not vals or not base_vals:
                    continue
                comparisons.append((p, stats.compare(vals, base_vals, fabric, base, metric, hib, alpha=alpha)))
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
    return Result(pts, comparisons, refusals, base)
