"""Write a Markdown and a self-contained HTML report: headlines, verdicts, charts, capacity, runs.

`fabricbench report DIR... --out report/ [--slo-ttft-ms 500] [--baseline FABRIC] [--external nccl-tests.json]`

Writes report.md, report.html (headline per workload first), report.json (the verdicts),
results.csv (every record's metrics) and nccl-tests/*.json (collectives in nccl-tests' -J shape).
"""

from analysis.cli import _common, _report_arguments, cmd_report


def add_arguments(parser) -> None:
    _common(parser)
    _report_arguments(parser)


def run(args) -> int:
    return cmd_report(args)
