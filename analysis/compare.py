"""Points, and each arm against the baseline at every point the guard allows.

A point is a set of runs with equal identity (analysis/guard.py): same everything but
the fabric. Its runs are grouped by arm (the study's arm label, else the fabric's name);
each group's records are the trials. Where the records carry a study's blocks the test
pairs the arms within blocks (analysis/stats.py).

What decides: each workload's primary metric at its declared point (`primary_metric`,
`primary_points`; a study may declare its own), one verdict per arm. The primary verdicts
of a study are one family, corrected together (Holm by default); every other metric is
exploratory, a family of its own with Benjamini-Hochberg intervals, never the headline. The
A/A control arm's verdicts are families of their own: the same correction over its own tests
(with two or more real arms the real family is larger, so the control is judged a little more
leniently than the verdicts it vouches for).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Callable, Iterable

import numpy as np
from scipy import stats as sps

from analysis import guard, stats
from analysis import looks as schedule
from analysis.load import Run, Table, is_served
from workloads import catalog
from workloads.core.errors import UsageError

# Which way is better, and the verdict's word, for a metric its workload does not declare
# (workloads/<name>/declare.py, read through the catalog, is asked first): rules over the unit
# the key carries, "faster" for times and rates. A metric matching nothing is refused, not guessed.
DIRECTIONS: list[tuple[str, bool, str]] = [  # (fnmatch pattern, higher is better, word)
    ("*_ms", False, "faster"), ("*(s)", False, "faster"), ("*(us)", False, "faster"),
    ("*(GB/s)", True, "faster"), ("*(MB/s)", True, "faster"), ("*(Gbit/s)", True, "faster"), ("*(Mpps)", True, "faster"),
    ("*_per_sec", True, "faster"), ("*_throughput", True, "faster"),
    ("*(%line)", True, "better"), ("*(%payload)", True, "better"),
]


def direction(metric: str) -> tuple[bool, str]:
    """(higher is better, verdict word) of a metric; UsageError when it has no known direction."""
    declared = catalog.metric(metric)
    if declared is not None:
        return declared.higher, declared.word
    for pattern, hib, word in DIRECTIONS:
        if metric == pattern or fnmatchcase(metric, pattern):
            return hib, word
    raise UsageError(f"--metric {metric}: no known direction (is higher or lower better?); compare a metric with "
                     f"a unit suffix (_ms, (s), (us), (GB/s), _per_sec, _throughput) or declare it in its workload's "
                     f"METRICS (the module its catalog entry `declares`, e.g. workloads/link/declare.py)")


def expand(wanted: Iterable[str], names: Iterable[str]) -> list[str]:
    """Metric names and fnmatch patterns ("all_reduce/busbw@*") expanded over `names`, in order."""
    names = sorted(set(names))
    out: list[str] = []
    for pattern in wanted:
        out += [n for n in names if (n == pattern or fnmatchcase(n, pattern)) and n not in out]
    return out


# Counts per run (a workload's Metric(counted=True)): a ratio of counts near 3 is mostly noise
# ("25% better"), and 0 is common, so a study judges them by the blocks' raw differences, always
# (a share or fraction only when a value is 0: elsewhere its log-ratio is the relative change
# the report states).
def counted(metric: str) -> bool:
    declared = catalog.metric(metric)
    return declared is not None and declared.counted


def headline(workload: str, names: Iterable[str]) -> list[str]:
    """The workload's headline metrics (workloads/catalog.py) present in `names`, patterns
    expanded, in catalog order."""
    return expand(catalog.field(workload, "headline", ()), names)


@dataclass
class Point:
    key: tuple
    runs: list[Run]

    @property
    def by_arm(self) -> dict[str, list[Run]]:
        out: dict[str, list[Run]] = defaultdict(list)
        for r in self.runs:
            out[r.arm].append(r)
        return dict(sorted(out.items()))

    @property
    def by_fabric(self) -> dict[str, list[Run]]:
        """`by_arm`, by its name before (kept for a release)."""
        return self.by_arm

    @property
    def label(self) -> str:
        r = self.runs[0]
        c = r.coords
        # a study's workload name tells two points of one entry apart (1 KiB and 4 MiB collectives)
        named = (r.study or {}).get("workload")
        parts = [r.workload, named if named != r.workload else None, r.model, r.parallel]
        # the world counts GPUs only where the runs had some: a CPU run's ranks are processes
        # (a record without a fingerprint says nothing, and keeps the old word)
        fps = [x.record.get("fingerprint") for x in self.runs]
        gpu = not all(isinstance(f, dict) and "gpu_count" in f and not f["gpu_count"] for f in fps)
        for k, short in (("world_size", "gpus" if gpu else "ranks"), ("global_batch", "batch"), ("micro_batch", "mb")):
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


DESIGNS = {"abba": "interleaved ABBA", "williams": "Williams design", "permuted": "permuted within blocks"}


def blocked(runs: list[Run], base_runs: list[Run], metric: str | Callable[[Run], float | None],
            raw: bool = False) -> tuple[list[float], str] | None:
    """Per-block log-ratios of `metric` (arm vs baseline) and the design's name, when every run
    of both sides carries a study block and a positive value; else None (Welch's t on the runs).
    `raw`: the blocks' raw differences, mean(arm) - mean(baseline), where a value may be 0.

    A block holding both sides gives one log-ratio, mean log(arm) - mean log(baseline); a
    block is keyed by (study id, block) so pooled studies never mix their blocks. A block
    with unequal counts of the two sides (a failed run) is dropped, and the design says so:
    swapping the sides as a whole is a relabelling of the block only when they are equally
    many."""
    every = [*runs, *base_runs]
    if not every or any(r.study is None or r.study.get("block") is None for r in every):
        return None
    cells: dict[tuple, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    value = metric if callable(metric) else (lambda r: r.metric(metric))
    for side, group in ((0, runs), (1, base_runs)):
        for r in group:
            v = value(r)
            if v is None:
                continue
            if v <= 0 and not raw:
                return None  # no log-ratio of a zero: the raw differences judge it (_compare_point)
            cells[(r.study.get("id"), r.study["block"])][side].append(v if raw else math.log(v))
    d = [sum(a) / len(a) - sum(b) / len(b) for a, b in cells.values() if a and b and len(a) == len(b)]
    dropped = len(cells) - len(d)
    designs = sorted({str(r.study.get("design")) for r in every})
    name = DESIGNS.get(designs[0], f"{designs[0]} blocks") if len(designs) == 1 else f"blocked ({'/'.join(designs)})"
    note = f"{name}, {len(d)} block{'s' if len(d) != 1 else ''}" + (f" ({dropped} incomplete dropped)" if dropped else "")
    return d, note


def _family(p: Point, c: stats.Comparison) -> tuple:
    """The correction family: the study (None outside one), whether the arm is its A/A
    control, and whether the verdict is primary (a decision) or exploratory."""
    ids = sorted({str((r.study or {}).get("id")) for r in p.runs if r.study})
    return tuple(ids), c.control, c.primary


def _study_value(runs: Iterable[Run], key: str, default):
    vals = {repr(v): v for r in runs if r.study and (v := r.study.get(key)) is not None}
    return next(iter(vals.values())) if len(vals) == 1 else default


def primary_metric(workload: str, names: Iterable[str]) -> str | None:
    """The metric a workload is judged on when none is declared (docs/statistics.md), as
    its catalog entry picks it: training samples/s; collectives the bus bandwidth of
    all_reduce (else the first op) at its largest message size; inference request throughput."""
    choose = catalog.field(workload, "primary")
    return choose(names) if choose else None


def _load_level(p: Point) -> float:
    c = p.runs[0].coords
    return c.get("concurrency", c.get("rate", math.inf))  # a burst (no rate) is the heaviest load


def primary_points(pts: list[Point]) -> set[int]:
    """Ids of the points whose primary metric decides: every training and collectives point;
    for an inference sweep the declared point (study `primary.point`), else its heaviest load
    point (the sweep's throughput at saturation), per group of points equal but for the load."""
    out: set[int] = set()
    sweeps: dict[tuple, list[Point]] = defaultdict(list)
    for p in pts:
        if not is_served(p.runs[0].workload):
            out.add(id(p))
            continue
        declared = _study_value(p.runs, "primary_point", None)
        if declared is not None:
            if p.runs[0].point == declared:
                out.add(id(p))
            continue
        coords = {k: v for k, v in p.runs[0].coords.items() if k not in ("concurrency", "rate", "max_concurrency", "burstiness")}
        sweeps[(p.runs[0].model, tuple(sorted(coords.items())), p.runs[0].arrival)].append(p)
    for group in sweeps.values():
        out.add(id(max(group, key=_load_level)))
    return out


@dataclass
class Result:
    points: list[Point]
    comparisons: list[tuple[Point, stats.Comparison]]
    refusals: list[guard.Refusal]
    baseline: str | None
    allow: tuple[str, ...] = ()   # identity keys declared allowed to differ (capacity groups sweeps with it)
    unmatched: list[Point] = field(default_factory=list)  # points neither compared nor a near miss
    # id(unmatched point) -> the identity keys splitting it from its nearest point of the same
    # fabric and coordinates, with (its value, that point's value): why it has no counterpart
    splits: dict[int, dict[str, tuple]] = field(default_factory=dict)
    excluded: list[Run] = field(default_factory=list)     # records whose status is not "ok": never analysed
    correction: str = "holm"
    alpha: float = 0.05

    def unmatched_summary(self, verbose: bool = False) -> str | None:
        """One line counting the points that had no counterpart and, where a point of the same
        fabric and coordinates exists, the keys that split them off; None when there are none.
        The count comes first, before any ';'."""
        n = len(self.unmatched)
        if not n:
            return None
        parts = [f"{n} point{'s' if n != 1 else ''} had no counterpart in another fabric (or no {self.baseline} run to "
                 f"compare with)"]
        by_keys = Counter(tuple(sorted(self.splits[id(p)])) for p in self.unmatched if self.splits.get(id(p)))
        for keys, k in by_keys.most_common():
            why = (f"{k} of them {'differ' if k != 1 else 'differs'} from a point of the same fabric and coordinates "
                   f"only in {', '.join(keys)}")
            if "fingerprint.git.commit" in keys:
                why += " (the code changed between their runs: run a study on one commit)"
            elif "fingerprint.git.dirty_hash" in keys:
                why += " (uncommitted edits changed the code between their runs: run a study on one version of the code)"
            parts.append(why + f"; --allow {' --allow '.join(keys)} pools them")
        return "; ".join(parts) + (":" if verbose else "; --verbose lists them")

    def unmatched_lines(self) -> list[str]:
        out = []
        for p in self.unmatched:
            line = f"{p.label}: only {', '.join(p.by_arm)} ({len(p.runs)} record{'s' if len(p.runs) != 1 else ''})"
            if split := self.splits.get(id(p)):
                line += "; split from its sibling by " + ", ".join(f"{k} ({a!r} vs {b!r})" for k, (a, b) in sorted(split.items()))
            out.append(line)
        return out

    def excluded_summary(self) -> str | None:
        """'2 records not analysed (failed 1, partial 1): a/records/x.json, ...' or None."""
        if not self.excluded:
            return None
        counts = Counter(r.status for r in self.excluded)
        n = len(self.excluded)
        return (f"{n} record{'s' if n != 1 else ''} not analysed ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}): "
                + ", ".join(f"{r.arm}: {r.source}" for r in self.excluded))

    def _families(self, control: bool, primary: bool = True) -> dict[tuple, list[tuple[Point, stats.Comparison]]]:
        fams: dict[tuple, list[tuple[Point, stats.Comparison]]] = defaultdict(list)
        for p, c in self.comparisons:
            if c.control == control and c.primary == primary:
                fams[_family(p, c)[0]].append((p, c))
        return dict(sorted(fams.items()))

    def control_status(self) -> list[tuple[str, str, str]]:
        """Per study with an A/A control arm: (kind, where, text), kind one of "loud" (the
        control called a difference: distrust every verdict), "equivalent", "bounded" (it can
        speak, found nothing, and bounds the bias by its interval), "mute" (it cannot speak:
        it could not detect a difference of the size the study asks for) and "untested".
        Judged on the control's primary verdicts, the same family the real ones face."""
        out = []
        fams = self._families(control=True)
        for ids, pcs in fams.items():
            where = f" (study {', '.join(ids)})" if len(fams) > 1 else ""
            cs = [c for _, c in pcs if c.tested]
            if not cs:
                out.append(("untested", where, "not tested (too few trials or blocks); nothing is known about bias"))
                continue
            detect = float(_study_value([r for p, _ in pcs for r in p.runs], "detect", stats.DETECT))
            loud = [c for c in cs if c.significant]
            worst = max(cs, key=lambda c: c.bias_bound)
            if loud:
                named = "; ".join(f"{c.metric}: {c.verdict}" for c in loud[:3]) + (f"; and {len(loud) - 3} more" if len(loud) > 3 else "")
                out.append(("loud", where, f"NOT quiet: {len(loud)} of {len(cs)} primary tests differ ({named}); the control "
                                           "arm runs the baseline's own settings, so treat every verdict with suspicion"))
            elif all(c.equivalent for c in cs):
                out.append(("equivalent", where, f"within +-{stats.pct(worst.bias_bound)} on every primary metric "
                                                 f"({len(cs)} test{'s' if len(cs) != 1 else ''}; equivalent at "
                                                 f"+-{stats.pct(worst.margin)})"))
            elif max(c.mde for c in cs) <= detect:
                out.append(("bounded", where, f"no bias found; the arms agree within +-{stats.pct(worst.bias_bound)} "
                                              f"({len(cs)} primary test{'s' if len(cs) != 1 else ''}; not yet equivalent "
                                              f"at +-{stats.pct(worst.margin)}; it could detect >= "
                                              f"{stats.pct(max(c.mde for c in cs))})"))
            else:
                mute = max(cs, key=lambda c: c.mde)
                need = self._blocks_needed(mute, detect)
                out.append(("mute", where, f"cannot speak: it could only detect a bias >= {stats.pct(mute.mde)} "
                                           f"(the study asks for {stats.pct(detect)}); {need}"))
        return out

    def control_lines(self, status: list[tuple[str, str, str]] | None = None) -> list[str]:
        """The A/A control's status (control_status(), or the one given), said before any verdict."""
        return [f"A/A control{where}{' ' if kind in ('loud', 'mute') else ': '}{text}"
                for kind, where, text in (self.control_status() if status is None else status)]

    def _blocks_needed(self, c: stats.Comparison, detect: float) -> str:
        if not c.blocks:
            return "run more trials per arm, or run a study (blocked runs pair out the machine's drift)"
        if not (c.sd > 0):
            return "run more blocks"
        cv = c.sd / math.sqrt(2)
        k = stats.blocks_for(detect, c.family, cv, self.alpha)
        # a new study, not more blocks on this one: its verdicts are printed, and adding blocks
        # until something is called is optional stopping (--until-decided plans its looks instead)
        return f"at its measured noise (CV {stats.pct(cv)}) a new study (--id <new id>) with blocks: {k} could" if k else \
            f"its noise (CV {stats.pct(cv)}) is too large to detect {stats.pct(detect)} in 200 blocks"

    def notes(self) -> list[str]:
        """What is said before the verdicts after the control: families that cannot call, and
        carry-over found in a study's primary metric."""
        return self.floor_lines() + self.carry_lines()

    def carry_lines(self) -> list[str]:
        """Per study point and primary metric whose runs show a first-order carry-over (a run
        differs by which arm ran just before it), the warning and the carry-adjusted differences.
        The A/A control cannot see a carry-over from another arm, and the verdicts' difference of
        means is biased by it whatever the order."""
        out, seen = [], set()
        for p, c in self.comparisons:
            if c.primary and not c.control and (id(p), c.metric) not in seen:
                seen.add((id(p), c.metric))
                if (line := carry_over(p, c.metric, c.baseline, self.alpha)) is not None:
                    out.append(line)
        return out

    def floor_lines(self) -> list[str]:
        """Per family of primary verdicts that cannot call any difference, why (and what would)."""
        out = []
        for ids, pcs in self._families(control=False).items():
            cs = [c for _, c in pcs if c.tested]
            if cs and not any(c.can_call for c in cs):
                c = cs[0]
                why = (f"{c.blocks} block(s) leave the test no spread to judge" if c.blocks else
                       f"{c.n} vs {c.n_base} runs leave the test no spread to judge")
                out.append(f"no verdict{' of study ' + ', '.join(ids) if ids else ''} can call a difference: {why}; "
                           f"{self._blocks_needed(c, stats.DETECT)}")
        return out


def carry_over(p: Point, metric: str, base: str, alpha: float) -> str | None:
    """A warning when the runs of one study at point `p` show a first-order carry-over, else None.

    Least squares of log(metric) on block + arm + the arm of the cell just before (by the
    schedule position every record carries), the usual model of a crossover design; Williams'
    balance makes the previous-arm terms estimable. F test of those terms at `alpha`; when it
    rejects, the carry-adjusted arm effects with their 95% t-intervals (per comparison)."""
    runs = p.runs
    if not runs or any(not r.study or r.study.get("position") is None or r.study.get("block") is None for r in runs) or \
            len({r.study.get("id") for r in runs}) != 1:
        return None
    values = [r.metric(metric) for r in runs]
    if any(v is None or v <= 0 for v in values):
        return None
    arm_at = {r.study["position"]: r.arm for r in runs}
    others = sorted({r.arm for r in runs} - {base})
    blocks = sorted({r.study["block"] for r in runs})
    x = np.array([[r.study["block"] == b for b in blocks] + [r.arm == a for a in others]
                  + [arm_at.get(r.study["position"] - 1) is None]
                  + [arm_at.get(r.study["position"] - 1) == a for a in others] for r in runs], dtype=float)
    y = np.log(values)
    q, df = len(others), len(runs) - x.shape[1]
    if not others or df < 2 or np.linalg.matrix_rank(x) < x.shape[1]:
        return None

    def rss(m: np.ndarray) -> tuple[float, np.ndarray]:
        beta = np.linalg.lstsq(m, y, rcond=None)[0]
        return float(np.sum((y - m @ beta) ** 2)), beta

    full, beta = rss(x)
    reduced, _ = rss(x[:, :-q])
    if not full > 0:
        return None
    f_p = float(sps.f.sf((reduced - full) / q / (full / df), q, df))
    if f_p >= alpha:
        return None
    cov = full / df * np.linalg.inv(x.T @ x)
    half = float(sps.t.ppf(0.975, df))
    carry = ", ".join(f"after {a} {100 * math.expm1(beta[-q + i]):+.1f}%" for i, a in enumerate(others))
    adjusted = "; ".join(
        f"{a} vs {base} {100 * math.expm1(beta[len(blocks) + i]):+.1f}% "
        f"[{100 * math.expm1(beta[len(blocks) + i] - half * math.sqrt(cov[len(blocks) + i, len(blocks) + i])):+.1f}, "
        f"{100 * math.expm1(beta[len(blocks) + i] + half * math.sqrt(cov[len(blocks) + i, len(blocks) + i])):+.1f}]"
        for i, a in enumerate(others))
    return (f"carry-over at {p.label} [{metric}]: a run differs by the arm run just before it ({carry} against after "
            f"{base}; F p={f_p:.3g}): the verdicts' differences of means are biased by it, and the A/A control cannot "
            f"see it. Carry-adjusted (block + arm + previous arm, least squares, 95% CI per comparison): {adjusted}")


def default_baseline(table: Table) -> str | None:
    """The studies' declared baseline when they agree on one, else the first label by name."""
    ok = table.ok()
    declared = {str(r.study["baseline"]) for r in ok if r.study and r.study.get("baseline") is not None}
    labels = sorted({r.arm for r in ok})
    if len(declared) == 1 and (b := declared.pop()) in labels:
        return b
    return labels[0] if labels else None


def compare_table(table: Table, baseline: str | None = None, allow: Iterable[str] = (), metrics: Iterable[str] | None = None,
                  alpha: float | None = None, correction: str = "holm") -> Result:
    # alpha None: the level the records' study was planned at (study.alpha), as its compare.txt judged
    allow, metrics, alpha = tuple(allow), list(metrics or []), alpha or float(_study_value(table.ok(), "alpha", 0.05))
    for m in metrics:
        if not any(ch in m for ch in "*?["):
            direction(m)  # an unknown direction is refused before anything is compared; patterns when expanded
    if correction not in stats.CORRECTIONS:
        raise UsageError(f"--correction {correction}: write one of {', '.join(stats.CORRECTIONS)}")
    pts = points(table, allow)
    fabrics = sorted({r.arm for r in table.ok()})
    base = baseline or default_baseline(table)
    raw: list[tuple[Point, stats.Comparison]] = []
    decides = primary_points(pts)
    for p in pts:
        groups = p.by_arm
        if base not in groups or len(groups) < 2:
            continue
        wl = p.runs[0].workload
        names = [m for r in p.runs for m in r.metrics]
        declared = _study_value(p.runs, "primary_metric", None)
        first = (expand([declared], names) or [None])[0] if declared else primary_metric(wl, names)
        if metrics:  # the user's own metrics are the decisions
            wanted, prim = expand(metrics, names), set(expand(metrics, names))
        else:
            wanted = ([first] if first else []) + [m for m in headline(wl, names) if m != first]
            prim = {first} if first and id(p) in decides else set()
        for metric in wanted:
            raw += [(p, c) for c in _compare_point(groups, base, metric, alpha, metric in prim)]
    comparisons = _correct(raw, correction, alpha)
    refusals, matched = near_misses(pts, base, fabrics, allow)
    unmatched = [p for p in pts if id(p) not in matched and not any(q is p for q, _ in comparisons)]
    return Result(pts, comparisons, refusals, base, allow, unmatched, splits(unmatched, pts, allow), list(table.not_ok()),
                  correction, alpha)


def _compare_point(groups: dict[str, list[Run]], base: str, metric: str, alpha: float,
                   primary: bool = True) -> list[stats.Comparison]:
    hib, word = direction(metric)
    every = [r for runs in groups.values() for r in runs]
    margin = float(_study_value(every, "margin", stats.MARGIN))
    looks = spent_looks(every)
    share = look_share(every)
    detect = float(_study_value(every, "detect", stats.DETECT))
    base_vals = [v for r in groups[base] if (v := r.metric(metric)) is not None]
    out = []
    for arm, runs in groups.items():
        vals = [v for r in runs if (v := r.metric(metric)) is not None]
        if arm == base or not vals or not base_vals:
            continue
        raw = counted(metric)
        design = None if raw else blocked(runs, groups[base], metric)
        if design is None and all(r.study and r.study.get("block") is not None for r in [*runs, *groups[base]]):
            # a count, or a share with a zero (no log-ratio): the blocks' raw differences, stated
            # per run, under the design the runs really had (never "run order not recorded")
            raw, design = True, blocked(runs, groups[base], metric, raw=True)
            design = design and (design[0], f"{design[1]}, paired differences per run")
        label = design[1] if design else None
        control = any(r.control for r in runs)
        taken = stats.Design(blocks=design[0] if design else None, name=label, step=stats.resolution(vals + base_vals),
                             raw=raw and design is not None)
        judging = stats.Judging(alpha=alpha, word=word, control=control, margin=margin, primary=primary, looks=looks,
                                detect=detect, share=share, higher_is_better=hib)
        out.append(stats.compare(vals, base_vals, arm, base, metric, taken, judging))
    return out


def spent_looks(runs: Iterable[Run]) -> int:
    """How many looks alpha is spent over: a sequential study's planned looks, plus one for
    every other size the study was run at. A study's records carry the blocks it was planned
    for when they ran (`study.blocks`); records of one study with two sizes are a study that
    was extended after its verdicts were printed (an older version allowed it): judging the
    extension at full alpha again is optional stopping, so each size is a look."""
    looks = [int(v) for r in runs if r.study and (v := r.study.get("looks")) is not None]
    sizes = {(r.study.get("id"), int(b)) for r in runs if r.study and (b := r.study.get("blocks")) is not None}
    per_study = Counter(i for i, _ in sizes)
    return max(looks or [1]) + max(per_study.values() or [1]) - 1


def look_share(runs: Iterable[Run]) -> float:
    """The fraction of alpha a sequential study's look spends (analysis/looks.py): its records
    carry the cap (`study.blocks`) and the count of looks, which give the schedule, and the look
    is the first at or past the blocks they hold. NaN (alpha/looks, compare.spent_looks) for a
    fixed study, one extended after its verdicts, or records whose schedule is not the one
    looks_at gives."""
    runs = [r for r in runs if r.study]
    looks = {int(v) for r in runs if (v := r.study.get("looks")) is not None}
    caps = {(r.study.get("id"), int(b)) for r in runs if (b := r.study.get("blocks")) is not None}
    if len(looks) != 1 or (n := looks.pop()) < 2 or len(caps) != 1:
        return math.nan
    plan = schedule.looks_at(next(iter(caps))[1])
    held = max((int(b) + 1 for r in runs if (b := r.study.get("block")) is not None), default=0)
    return schedule.share(plan, held) if len(plan) == n and held else math.nan


def _correct(raw: list[tuple[Point, stats.Comparison]], correction: str, alpha: float) -> list[tuple[Point, stats.Comparison]]:
    """Every comparison corrected within its family, in the original order."""
    fams: dict[tuple, list[int]] = defaultdict(list)
    for i, (p, c) in enumerate(raw):
        fams[_family(p, c)].append(i)
    out = list(raw)
    for key, idx in fams.items():
        # exploratory verdicts: intervals with false-coverage control (BH), never the decision
        method = correction if key[2] else "bh"
        for i, c in zip(idx, stats.correct([raw[i][1] for i in idx], method, alpha)):
            out[i] = (raw[i][0], c)
    return out


def splits(unmatched: list[Point], pts: list[Point], allow: tuple[str, ...]) -> dict[int, dict[str, tuple]]:
    """For each unmatched point, the identity keys that split it from its nearest sibling: a
    point of the same workload and coordinates holding a fabric it holds, compared run against
    run of that fabric. A study resumed after a `git pull` leaves its late runs as such points,
    split off by fingerprint.git.commit; without this they would only be counted. Points with
    no sibling (a sweep point one fabric alone ran) are left out: nothing split them."""
    out: dict[int, dict[str, tuple]] = {}
    for p in unmatched:
        best, mine = None, p.by_arm
        for q in pts:
            if q is p or q.label != p.label:  # the label starts with the workload
                continue
            theirs = q.by_arm
            shared = [f for f in mine if f in theirs]
            if not shared:
                continue
            d = guard.differences(mine[shared[0]][0].record, theirs[shared[0]][0].record, allow)
            if d and (best is None or len(d) < len(best)):
                best = d
        if best:
            out[id(p)] = best
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
        mine = [p for p in pts if base in p.by_arm and other not in p.by_arm]
        theirs = [q for q in pts if other in q.by_arm and base not in q.by_arm]
        rec = lambda p, f: p.by_arm[f][0].record  # noqa: E731
        shared = any(base in p.by_arm and other in p.by_arm for p in pts)
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
