"""Write a Markdown and a self-contained HTML report: verdicts, capacity, plots, runs.

`fabricbench report DIR... --out report/ [--slo-ttft-ms 500] [--baseline FABRIC]`
"""

from analysis.cli import _common, _report_arguments, cmd_report


def add_arguments(parser) -> None:
    _common(parser)
    _report_arguments(parser)


def run(args) -> int:
    return cmd_report(args)
