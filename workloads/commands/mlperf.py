"""MLPerf result logs of two systems (or fabrics) compared: MLPerf's own scores, their ratio, and a verdict.

    fabricbench mlperf ETH=results/eth/bert IB=results/ib/bert
    fabricbench mlperf results/XE9680/llama2-70b-99.9 results/XD670/llama2-70b-99.9 --json verdicts.json

`fabricbench mlperf [LABEL=]DIR [LABEL=]DIR [--alpha A] [--margin M] [--json [FILE]]`: each DIR is an
MLPerf Training benchmark folder (result_*.txt) or an Inference results folder (LoadGen's
mlperf_log_summary.txt / mlperf_log_detail.txt per run), or a folder above several of them; the
benchmarks both hold are compared (analysis/mlperf.py, docs/mlperf.md). LABEL defaults to the system
the logs name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workloads.core.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sides", nargs="+", metavar="[LABEL=]DIR", help="the two systems' result folders")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--margin", type=float, default=None,
                   help="equivalence margin as a fraction (default 0.02: 'equivalent within +-2%%')")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write the table and verdicts as JSON to FILE (no FILE: to stdout, instead of the text)")


def _side(arg: str) -> tuple[str | None, str]:
    label, eq, path = arg.partition("=")
    if eq and label and not Path(arg).exists():
        return label, path
    return None, arg


def _row(r) -> dict:
    from analysis import stats

    c = r.comparison
    return {"benchmark": r.a.benchmark, "scenario": r.a.scenario, "metric": r.a.metric, "kind": r.a.kind,
            "score_a": r.a.score, "score_b": r.b.score, "ratio": r.ratio, "runs_a": list(r.a.trials),
            "runs_b": list(r.b.trials), "verdict": None if c is None else stats.verdict(c),
            "why_no_verdict": r.why or None, "notes_a": list(r.a.notes), "notes_b": list(r.b.notes),
            "sources_a": list(r.a.sources), "sources_b": list(r.b.sources)}


def run(args) -> int:
    from analysis import mlperf, stats

    if len(args.sides) != 2:
        raise UsageError(f"{len(args.sides)} folders given: pass two, [LABEL=]DIR each (the baseline second)")
    if args.margin is not None and not 0 < args.margin < 1:
        raise UsageError(f"--margin {args.margin:g}: write a fraction between 0 and 1, e.g. 0.02")
    (la, da), (lb, db) = (_side(s) for s in args.sides)
    a, b = mlperf.collect(da), mlperf.collect(db)
    la = la or a[0].system
    lb = lb or b[0].system
    if la == lb:
        raise UsageError(f"both folders are labelled {la!r}; name them: LABEL=DIR LABEL=DIR")
    result = mlperf.judge(a, b, la, lb, args.alpha, stats.MARGIN if args.margin is None else args.margin)
    if args.json is not None:
        text = json.dumps({"a": la, "b": lb, "rows": [_row(r) for r in result.rows], "only": result.only}, indent=1)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            try:
                Path(args.json).write_text(text + "\n")
            except OSError as e:
                raise UsageError(f"--json {args.json}: cannot write ({e.strerror}); give a writable file name") from None
    if args.json != "-":
        print("\n".join(mlperf.lines(result)))
    if not result.rows:
        raise UsageError(f"no benchmark both hold: {'; '.join(result.only)}")
    return 0
