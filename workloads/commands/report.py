"""Write a Markdown and a self-contained HTML report: headlines, verdicts, charts, capacity, runs.

    fabricbench report results/ --out report/ --slo-ttft-ms 500
    fabricbench report --wandb my-team/fabricbench --group pretrain-neox-1.3b-zero1-ws16 --out report/

`fabricbench report DIR... --out report/ [--slo-ttft-ms 500] [--baseline FABRIC] [--external nccl-tests.json]`

Writes report.md, report.html (headline per workload first), report.json (the verdicts),
results.csv (every record's metrics) and nccl-tests/*.json (collectives in nccl-tests' -J shape).
"""

from __future__ import annotations

import argparse

from workloads.commands.compare import _common, _load, _print
from workloads.core.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    _report_arguments(parser)


def run(args) -> int:
    return cmd_report(args)


def cmd_report(args) -> int:
    from analysis import external
    from analysis.report import write_report

    made = _check_out(args.out)
    try:
        slo = args.slo_ttft_ms
        if slo is not None and not (0 < slo < float("inf")):  # a negative bound would mark every point as missing it
            raise UsageError(f"--slo-ttft-ms {slo:g}: give the TTFT bound as a positive number of milliseconds, e.g. 500")
        ext = external.load(args.external)  # a bad file is named before any work
        table, result = _load(args)
    except BaseException:
        _unmake(made)  # a refused report leaves no empty --out folder behind
        raise
    _print(result, getattr(args, "verbose", False), args.dirs)
    rep = write_report(table, result, args.out, args.slo_ttft_ms, f"{args.slo_percentile}_ttft_ms", external_runs=ext)
    print(f"report: {rep.markdown}\nreport: {rep.html}\nverdicts: {rep.json}\nmetrics: {rep.csv}\n"
          f"plots: {len(rep.images)} PNG (+SVG) in {rep.markdown.parent / 'plots'}")
    return 0


def _check_out(out: str) -> list:
    """Refuse an --out that cannot take the report; the folders this check created, deepest first."""
    from pathlib import Path

    p = Path(out)
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {out} is a file; give a directory for the report (it is created if missing)")
    from workloads.core.records import not_writable

    made = [q for q in [p, *p.parents] if not q.exists()]
    if (why := not_writable(p)) is not None:
        _unmake(made)
        raise UsageError(f"--out {out} is not writable ({why}); give a directory you can write")
    return made


def _unmake(made: list) -> None:
    for q in made:
        try:
            q.rmdir()  # only while empty
        except OSError:
            return


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="report", help="output directory (default: report)")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="inference capacity: TTFT bound in ms")
    p.add_argument("--external", action="append", default=[], metavar="FILE",
                   help="nccl-tests -J or rccl-tests -Z json results to draw beside the busbw curves (repeatable; "
                        "for reference: never compared)")
    p.add_argument("--slo-percentile", default="p90", choices=["median", "p90", "p95", "p99"], help="TTFT statistic (default p90)")
