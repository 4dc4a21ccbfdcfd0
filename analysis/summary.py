"""What the report says in words: a headline per workload, the verdict table's rows, and the
refusals grouped by the keys that differ.

Nothing here computes a statistic: ratios, intervals, p values and the A/A control's outcome
come from analysis/compare.py (Result, stats.Comparison); a ratio is put into words by
stats.edge, the same function the verdict sentences use, so the report says "29.9% faster"
wherever it speaks of that ratio.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Iterable

from analysis import guard, stats
from analysis.compare import Point, Result
from analysis.load import Run, size_text
from workloads import catalog

METRIC_NAMES = {"samples_per_sec": "samples/s", "request_throughput": "requests/s", "median_ttft_ms": "median TTFT",
                "p99_ttft_ms": "p99 TTFT", "tflops_per_gpu": "TFLOPS/GPU"}


def display(workload: str) -> str:
    """'finetune' -> 'Fine-tuning'; a workload the catalog does not know, as itself."""
    return catalog.field(workload, "display", workload)


def metric_name(metric: str) -> str:
    """'all_reduce/avg_busbw(GB/s)' -> 'all_reduce bus bandwidth'."""
    if metric.endswith("/avg_busbw(GB/s)"):
        return f"{metric.split('/')[0]} bus bandwidth"
    if "/busbw@" in metric:  # 'all_reduce/busbw@1048576(GB/s)' -> 'all_reduce bus bandwidth at 1M'
        op, size = metric.split("/busbw@")
        return f"{op} bus bandwidth at {size_text(int(size.split('(')[0]))}"
    return METRIC_NAMES.get(metric, metric)


def edge_text(c: stats.Comparison) -> str:
    """'loopback 29.9% faster [10.0, 50.1]': the leader, by how much, and that percentage's
    interval at the level its test was judged at (the table's "CI level" column; 95% for a test
    alone, per comparison under Holm or BH). A latency: 'roce 49.7% lower [48.2, 51.2]'."""
    lead, _, pct, lo, hi = stats.edge(c)
    if c.raw:  # a count's difference per run, in its own units (stats.gap)
        word = "higher" if c.higher_is_better else "lower"
        return f"{lead} {pct:.3g} {word} per run" + (" (not tested)" if not c.tested else f" [{lo:.3g}, {hi:.3g}]")
    if not c.tested:
        return f"{lead} {100 * pct:.1f}% {c.says} (not tested)"
    return f"{lead} {100 * pct:.1f}% {c.says} [{100 * lo:.1f}%, {100 * hi:.1f}%]"


def outcome(c: stats.Comparison) -> str:
    """The verdict's word for the table, for the arm: faster/slower (or better/worse; a latency
    lower/higher), equivalent, inconclusive, not tested."""
    if c.outcome == "differs":
        ahead = stats.edge(c)[0] == c.arm
        return {"faster": ("faster", "slower"), "better": ("better", "worse"), "lower": ("lower", "higher")}[c.says][not ahead] + \
            ("" if c.primary else " (exploratory)")
    return {"untested": "not tested"}.get(c.outcome, c.outcome) + ("" if c.primary or not c.tested else " (exploratory)")


VERDICT_HEAD = ["workload", "point", "metric", "baseline", "baseline median", "arm", "arm median",
                "difference [CI]", "CI level", "corrected p", "n", "outcome"]


def verdict_rows(result: Result) -> list[list[str]]:
    """One row per verdict: raw medians in the metric's units, the difference in words."""
    p_ = lambda v: "n/a" if v != v else f"{v:.3g}"  # noqa: E731
    return [[display(p.runs[0].workload), _short(p), c.metric, c.baseline,
             f"{c.median_base:.4g}", c.arm + (" (A/A control)" if c.control else ""), f"{c.median:.4g}", edge_text(c),
             f"{100 * c.conf:.4g}%", p_(c.p_adj), f"{c.blocks} blocks" if c.blocks else f"{c.n} vs {c.n_base}",
             outcome(c)] for p, c in result.comparisons]


def _short(p: Point) -> str:
    """The point's label without the workload name (its own column)."""
    return p.label.split(" ", 1)[1] if " " in p.label else p.label


def _control(result: Result) -> str:
    status = result.control_status()
    if not status:
        return ("No A/A control arm in these records, so the pipeline and order effects shared by every arm are "
                "not checked.")
    words = {"loud": "A/A control{w} NOT quiet, so distrust these verdicts: {t}", "equivalent": "A/A control{w}: {t}.",
             "bounded": "A/A control{w}: {t}.", "mute": "A/A control{w} {t}.", "untested": "A/A control{w}: {t}."}
    return " ".join(words[k].format(w=w, t=t.removeprefix("NOT quiet: ")) for k, w, t in status)


def headlines(result: Result) -> list[tuple[str, str, str]]:
    """(workload name, claim, detail) per primary verdict of a real arm, in the order compared:
    the verdict at the workload's declared point, never the largest of several gaps (a
    selected maximum shown with an unselected interval overstates). The detail: where, the
    method, the A/A control's status."""
    control = _control(result)
    out = []
    for p, c in result.comparisons:
        if c.primary and not c.control:
            out.append((display(p.runs[0].workload), congestion_claim(p, c) or claim(c),
                        f"(at {_short(p)}; {stats.method_note(c)}.) {control}"))
    return out


def claim(c: stats.Comparison) -> str:
    """'samples/s: roce is 12.0% faster than ib [95% CI 9.1% to 15.2%].', or equivalent, or inconclusive."""
    metric = metric_name(c.metric)
    lead, trail, frac, lo, hi = stats.edge(c)
    if c.raw:  # a count's difference per run: the verdict's own sentence, its units kept
        return f"{metric}: {c.verdict}"
    ci = f"[{100 * c.conf:.4g}% CI {100 * lo:.1f}% to {100 * hi:.1f}%]"
    if c.outcome == "untested":
        return f"{metric}: not tested, too few trials ({lead} {100 * frac:.1f}% {c.says} than {trail})."
    if c.outcome == "differs":
        return f"{metric}: {lead} is {100 * frac:.1f}% {c.says} than {trail} {ci}."
    if c.outcome == "equivalent":  # the claim rests on the TOST interval, so that is the one quoted
        _, _, _, elo, ehi = stats.edge(replace(c, speedup_lo=c.eq_lo, speedup_hi=c.eq_hi))
        return (f"{metric}: {c.arm} and {c.baseline} are equivalent within +-{stats.pct(c.margin)} "
                f"[{100 * c.eq_conf:.4g}% CI {100 * elo:.1f}% to {100 * ehi:.1f}%, two one-sided tests].")
    could = f"could detect >= {stats.pct(c.mde)}" if math.isfinite(c.mde) else "cannot call any difference with these runs"
    return f"{metric}: inconclusive, {lead} {100 * frac:.1f}% {c.says} than {trail} {ci}; this study {could}."


def congestion_claim(p: Point, c: stats.Comparison) -> str | None:
    """The congestion-impact verdict, when the arm ran every trial under background traffic and
    the baseline none (docs/metrics.md): the verdict's own sentence (stats.edge: the same number
    the verdict table quotes for this ratio) with the factor beside, 'bus bandwidth: quiet is
    99.3% faster than noisy [95% CI ...] (congestion-impact factor 0.502 [0.476, 0.528]; under
    iperf3 TCP, 1 stream(s) at 50Mbit/s each, node 0 -> node 1, median 48.9 Mbit/s of it)'.
    None for any other pair of arms."""
    arm, base = p.by_arm.get(c.arm, []), p.by_arm.get(c.baseline, [])
    if not arm or not base or not all(r.noise for r in arm) or any(r.noise for r in base):
        return None
    under = f"under {arm[0].noise.get('description')}{_noise_measured(arm)}"
    factor = f"congestion-impact factor {c.speedup:.3f} [{c.speedup_lo:.3f}, {c.speedup_hi:.3f}]"
    return f"{claim(c).removesuffix('.')} ({factor}; {under})."


def _noise_measured(arm: list[Run]) -> str:
    """', median 48.9 Mbit/s of it' (iperf3) or ', median 1.92 cores busy' (a CPU hog): what the
    noise really did while the arm's points were measured, from the records."""
    during = [r.noise["during_point"] for r in arm if r.noise.get("during_point")]
    for key, text in (("throughput(Mbit/s)", ", median {:.1f} Mbit/s of it"), ("cores_busy", ", median {:.2f} cores busy")):
        values = sorted(d[key] for d in during if key in d)
        if values:
            return text.format(values[len(values) // 2])
    return ""


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
