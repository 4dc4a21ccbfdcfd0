"""What the report says in words: a headline per workload, the verdict table's rows, and the
refusals grouped by the keys that differ.

Nothing here computes a statistic: ratios, intervals, p values and the A/A control's outcome
come from analysis/compare.py (Result, stats.Comparison); a ratio is put into words by
stats.edge, the same function the verdict sentences use, so the report says "29.9% faster"
wherever it speaks of that ratio.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from analysis import compare, guard, stats
from analysis.compare import Point, Result

WORKLOAD_NAMES = {"pretrain": "Pre-training", "finetune": "Fine-tuning", "collectives": "Collectives",
                  "inference": "Inference"}
METRIC_NAMES = {"samples_per_sec": "samples/s", "request_throughput": "requests/s", "median_ttft_ms": "median TTFT",
                "p99_ttft_ms": "p99 TTFT", "tflops_per_gpu": "TFLOPS/GPU"}


def metric_name(metric: str) -> str:
    """'all_reduce/avg_busbw(GB/s)' -> 'all_reduce bus bandwidth'."""
    if metric.endswith("/avg_busbw(GB/s)"):
        return f"{metric.split('/')[0]} bus bandwidth"
    return METRIC_NAMES.get(metric, metric)


def edge_text(c: stats.Comparison) -> str:
    """'loopback 29.9% faster [10.0, 50.1]': the leader, by how much, and that percentage's 95% interval."""
    lead, _, pct, lo, hi = stats.edge(c)
    if not c.tested:
        return f"{lead} {100 * pct:.1f}% {c.word} (not tested)"
    return f"{lead} {100 * pct:.1f}% {c.word} [{100 * lo:.1f}%, {100 * hi:.1f}%]"


def outcome(c: stats.Comparison) -> str:
    return "not tested" if not c.tested else "significant" if c.significant else "not significant"


VERDICT_HEAD = ["workload", "point", "metric", "baseline", "baseline median", "arm", "arm median",
                "difference [95% CI]", "corrected p", "n", "outcome"]


def verdict_rows(result: Result) -> list[list[str]]:
    """One row per verdict: raw medians in the metric's units, the difference in words."""
    p_ = lambda v: "n/a" if v != v else f"{v:.3g}"  # noqa: E731
    return [[WORKLOAD_NAMES.get(p.runs[0].workload, p.runs[0].workload), _short(p), c.metric, c.baseline,
             f"{c.median_base:.4g}", c.fabric + (" (A/A control)" if c.control else ""), f"{c.median:.4g}", edge_text(c),
             p_(c.p_adj), f"{c.n} vs {c.n_base}", outcome(c)] for p, c in result.comparisons]


def _short(p: Point) -> str:
    """The point's label without the workload name (its own column)."""
    return p.label.split(" ", 1)[1] if " " in p.label else p.label


def _control(cs: list[stats.Comparison]) -> str:
    ctl = [c for c in cs if c.control]
    if not ctl:
        return "No A/A control arm in these records, so the false-positive rate is not checked."
    tested = [c for c in ctl if c.tested]
    if not tested:
        return "A/A control: not tested (too few trials)."
    sig = sum(c.significant for c in tested)
    if sig:
        return f"A/A control NOT quiet: {sig} of {len(tested)} tests significant, so distrust these verdicts."
    return f"A/A control quiet: 0 of {len(tested)} tests significant."


def headlines(result: Result) -> list[tuple[str, str, str]]:
    """(workload name, claim, detail) per workload and arm, on the workload's first headline
    metric. The claim: the largest difference as a percentage with its interval, and how many
    points were significant; the detail: where, the design and correction, the A/A control."""
    by_wl: dict[str, list[tuple[Point, stats.Comparison]]] = defaultdict(list)
    for p, c in result.comparisons:
        by_wl[p.runs[0].workload].append((p, c))
    out = []
    for wl, pcs in by_wl.items():
        names = {c.metric for _, c in pcs}
        first = compare.expand(compare.METRICS.get(wl, [])[:1], names) or sorted(names)[:1]
        arms = sorted({c.fabric for _, c in pcs if not c.control})
        for arm in arms:
            mine = [(p, c) for p, c in pcs if c.fabric == arm and c.metric in first]
            if mine:
                claim, detail = _sentence(mine)
                out.append((WORKLOAD_NAMES.get(wl, wl), claim, f"{detail} {_control([c for _, c in pcs])}"))
    return out


def _sentence(mine: list[tuple[Point, stats.Comparison]]) -> tuple[str, str]:
    p, c = max(mine, key=lambda pc: abs(pc[1].speedup - 1) if pc[1].speedup == pc[1].speedup else -1)
    metric = metric_name(c.metric)
    lead, trail, pct, lo, hi = stats.edge(c)
    interval = f" [95% CI {100 * lo:.1f}% to {100 * hi:.1f}%]" if c.tested else ""
    tested = [x for _, x in mine if x.tested]
    sig = [x for x in tested if x.significant]
    if not tested:
        status = "not tested: too few trials"
    elif len(mine) == 1:
        status = outcome(c)
    else:
        status = (f"significant at {len(sig)} of {len(mine)} points" if sig else
                  f"not significant at any of {len(tested)} points tested")
    where = f"at {_short(p)}" if len(mine) == 1 else f"largest gap of {len(mine)} points, at {_short(p)}"
    claim = f"{metric}: {lead} is {100 * pct:.1f}% {c.word} than {trail}{interval}; {status}."
    return claim, f"({where}; {stats.method_note(c)}.)"


def relative(text: str, root: Path | None) -> str:
    return text.replace(f"{root}{os.sep}", "") if root is not None else text


def refusal_groups(refusals: Iterable[guard.Refusal], root: Path | None) -> list[tuple[str, list[str]]]:
    """(summary, pairs) per set of differing keys, largest group first; paths relative to `root`."""
    groups: dict[tuple[str, ...], list[guard.Refusal]] = defaultdict(list)
    for r in refusals:
        groups[tuple(sorted(r.diffs))].append(r)
    out = []
    for keys, refs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        n = len(refs)
        summary = (f"{n} pair{'s differ' if n != 1 else ' differs'} in {', '.join(keys)} "
                   f"(to compare them anyway: {' '.join(f'--allow {k}' for k in keys)})")
        pairs = [relative(f"{r.a} vs {r.b}: " + ", ".join(f"{k} {va!r} vs {vb!r}" for k, (va, vb) in sorted(r.diffs.items())),
                          root) for r in refs]
        out.append((summary, pairs))
    return out
