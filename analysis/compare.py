"""Points, and each arm against the baseline at every point the guard allows.

A point is a set of runs with equal identity (analysis/guard.py): same everything but
the fabric. Its runs are grouped by arm (the study's arm label, else the fabric's name);
each group's records are the trials. Where the records carry a study's blocks the test
pairs the arms within blocks (analysis/stats.py); every verdict of a study is then
corrected together (one family per study; the A/A control arm's tests are a family of
their own, so the control faces exactly the correction the real verdicts face).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
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


def expand(wanted: Iterable[str], names: Iterable[str]) -> list[str]:
    """Metric names and fnmatch patterns ("all_reduce/busbw@*") expanded over `names`, in order."""
    names = sorted(set(names))
    out: list[str] = []
    for pattern in wanted:
        out += [n for n in names if (n == pattern or fnmatchcase(n, pattern)) and n not in out]
    return out


def higher_is_better(metric: str) -> bool:
    return direction(metric)[0]


def headline(workload: str, names: Iterable[str]) -> list[str]:
    """The workload's headline metrics present in `names`, patterns expanded, in registry order."""
    return expand(METRICS.get(workload, []), names)


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


DESIGNS = {"abba": "interleaved ABBA", "permuted": "permuted within blocks"}


def blocked(runs: list[Run], base_runs: list[Run], metric: str) -> tuple[list[float], str] | None:
    """Per-block log-ratios of `metric` (arm vs baseline) and the design's name, when every run
    of both sides carries a study block and a positive value; else None (the rank test).

    A block holding both sides gives one log-ratio, mean log(arm) - mean log(baseline); a
    block is keyed by (study id, block) so pooled studies never mix their blocks. A block
    with unequal counts of the two sides (a failed run) is dropped, and the design says so:
    swapping the sides as a whole is a relabelling of the block only when they are equally
    many."""
    every = [*runs, *base_runs]
    if not every or any(r.study is None or r.study.get("block") is None for r in every):
        return None
    cells: dict[tuple, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for side, group in ((0, runs), (1, base_runs)):
        for r in group:
            v = r.metric(metric)
            if v is None:
                continue
            if v <= 0:
                return None  # no log-ratio of a zero; the rank test handles it
            cells[(r.study.get("id"), r.study["block"])][side].append(math.log(v))
    d = [sum(a) / len(a) - sum(b) / len(b) for a, b in cells.values() if a and b and len(a) == len(b)]
    dropped = len(cells) - len(d)
    designs = sorted({str(r.study.get("design")) for r in every})
    name = DESIGNS.get(designs[0], f"{designs[0]} blocks") if len(designs) == 1 else f"blocked ({'/'.join(designs)})"
    note = f"{name}, {len(d)} block{'s' if len(d) != 1 else ''}" + (f" ({dropped} incomplete dropped)" if dropped else "")
    return d, note


def _family(p: Point, c: stats.Comparison) -> tuple:
    """The correction family: the study (None outside one) and whether the arm is its A/A control."""
    ids = sorted({str((r.study or {}).get("id")) for r in p.runs if r.study})
    return tuple(ids), c.control


@dataclass
class Result:
    points: list[Point]
    comparisons: list[tuple[Point, stats.Comparison]]
    refusals: list[guard.Refusal]
    baseline: str | None
    allow: tuple[str, ...] = ()   # identity keys declared allowed to differ (capacity groups sweeps with it)
    unmatched: list[Point] = field(default_factory=list)  # points neither compared nor a near miss
    excluded: list[Run] = field(default_factory=list)     # records whose status is not "ok": never analysed
    correction: str = "holm"
    alpha: float = 0.05

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

    def excluded_summary(self) -> str | None:
        """'2 records not analysed (failed 1, partial 1): a/records/x.json, ...' or None."""
        if not self.excluded:
            return None
        counts = Counter(r.status for r in self.excluded)
        n = len(self.excluded)
        return (f"{n} record{'s' if n != 1 else ''} not analysed ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}): "
                + ", ".join(f"{r.fabric}: {r.source}" for r in self.excluded))

    def control_lines(self) -> list[str]:
        """Per study with an A/A control arm: did the control stay quiet? Said before any verdict."""
        out = []
        fams: dict[tuple, list[stats.Comparison]] = defaultdict(list)
        for p, c in self.comparisons:
            if c.control:
                fams[_family(p, c)[0]].append(c)
        for ids, cs in sorted(fams.items()):
            where = f" (study {', '.join(ids)})" if len(fams) > 1 else ""
            tested = [c for c in cs if c.tested]
            if not tested:
                out.append(f"A/A control{where}: not tested (too few trials or blocks); nothing is known about false positives")
                continue
            m, corr = len(tested), stats.CORRECTION_NAMES[self.correction]
            after = "uncorrected" if self.correction == "none" else f"after {corr}"
            if not any(c.can_call for c in tested):  # quiet by construction says nothing
                out.append(f"A/A control{where}: cannot speak — {self._floor_reason(tested)}")
                continue
            raw = sum(c.p < self.alpha for c in tested)
            sig = [c for c in tested if c.significant]
            if not sig:
                out.append(f"A/A control{where}: quiet — 0 of {m} tests significant {after} ({raw} with uncorrected "
                           f"p < {self.alpha:g}; {self.alpha * m:.2g} expected by chance)")
            else:
                named = "; ".join(f"{c.metric}: {c.verdict}" for c in sig[:3]) + (f"; and {len(sig) - 3} more" if len(sig) > 3 else "")
                out.append(f"A/A control{where} NOT quiet: {len(sig)} of {m} tests significant {after} ({named}); "
                           f"the control arm runs the baseline's own fabric, so treat every verdict with suspicion")
        return out


    def _floor_reason(self, family: list[stats.Comparison]) -> str:
        c = min(family, key=lambda c: c.floor_adj)
        corr = "uncorrected" if self.correction == "none" else \
            f"after {stats.CORRECTION_NAMES[self.correction]} over {c.family} test{'s' if c.family != 1 else ''}"
        fix = (f"run >= {stats.blocks_needed(c.family, self.alpha, self.correction)} blocks" if c.blocks else
               "run more trials per arm") + (", fewer tests (--metric) or --correction bh" if self.correction == "holm" else "")
        return (f"no test could reach p < {self.alpha:g} {corr} ({c.design}: the smallest p is {c.floor:.3g}, "
                f"{c.floor_adj:.3g} corrected); {fix}")

    def floor_lines(self) -> list[str]:
        """Per family of real verdicts that cannot call any difference, why (and what would)."""
        fams: dict[tuple, list[stats.Comparison]] = defaultdict(list)
        for p, c in self.comparisons:
            if not c.control and c.tested:
                fams[_family(p, c)[0]].append(c)
        return [f"no verdict{' of study ' + ', '.join(ids) if ids else ''} can be significant: {self._floor_reason(cs)}"
                for ids, cs in sorted(fams.items()) if not any(c.can_call for c in cs)]


def default_baseline(table: Table) -> str | None:
    """The studies' declared baseline when they agree on one, else the first label by name."""
    ok = table.ok()
    declared = {str(r.study["baseline"]) for r in ok if r.study and r.study.get("baseline") is not None}
    labels = sorted({r.fabric for r in ok})
    if len(declared) == 1 and (b := declared.pop()) in labels:
        return b
    return labels[0] if labels else None


def compare_table(table: Table, baseline: str | None = None, allow: Iterable[str] = (), metrics: Iterable[str] | None = None,
                  alpha: float = 0.05, correction: str = "holm") -> Result:
    allow = tuple(allow)
    metrics = list(metrics or [])
    for m in metrics:
        if not any(ch in m for ch in "*?["):
            direction(m)  # an unknown direction is refused before anything is compared; patterns when expanded
    if correction not in stats.CORRECTIONS:
        raise UsageError(f"--correction {correction}: write one of {', '.join(stats.CORRECTIONS)}")
    pts = points(table, allow)
    fabrics = sorted({r.fabric for r in table.ok()})
    base = baseline or default_baseline(table)
    raw: list[tuple[Point, stats.Comparison]] = []
    for p in pts:
        groups = p.by_fabric
        if base not in groups or len(groups) < 2:
            continue
        wl = p.runs[0].workload
        names = [m for r in p.runs for m in r.metrics]
        wanted = expand(metrics, names) if metrics else headline(wl, names)
        for metric in wanted:
            raw += [(p, c) for c in _compare_point(groups, base, metric, alpha)]
    comparisons = _correct(raw, correction, alpha)
    refusals, matched = near_misses(pts, base, fabrics, allow)
    unmatched = [p for p in pts if id(p) not in matched and not any(q is p for q, _ in comparisons)]
    return Result(pts, comparisons, refusals, base, allow, unmatched, list(table.not_ok()), correction, alpha)


def _compare_point(groups: dict[str, list[Run]], base: str, metric: str, alpha: float) -> list[stats.Comparison]:
    hib, word = direction(metric)
    base_vals = [v for r in groups[base] if (v := r.metric(metric)) is not None]
    out = []
    for arm, runs in groups.items():
        vals = [v for r in runs if (v := r.metric(metric)) is not None]
        if arm == base or not vals or not base_vals:
            continue
        design = blocked(runs, groups[base], metric)
        control = any(r.control for r in runs)
        out.append(stats.compare(vals, base_vals, arm, base, metric, hib, alpha=alpha, word=word,
                                 blocks=design[0] if design else None, design=design[1] if design else None,
                                 control=control))
    return out


def _correct(raw: list[tuple[Point, stats.Comparison]], correction: str, alpha: float) -> list[tuple[Point, stats.Comparison]]:
    """Every comparison corrected within its family, in the original order."""
    fams: dict[tuple, list[int]] = defaultdict(list)
    for i, (p, c) in enumerate(raw):
        fams[_family(p, c)].append(i)
    out = list(raw)
    for idx in fams.values():
        for i, c in zip(idx, stats.correct([raw[i][1] for i in idx], correction, alpha)):
            out[i] = (raw[i][0], c)
    return out


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
