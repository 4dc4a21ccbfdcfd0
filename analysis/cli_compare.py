"""Compare fabrics point by point: verdicts with 95% intervals, refused pairs named.

`fabricbench compare DIR... [--wandb entity/project] [--baseline ARM] [--allow KEY]
[--correction holm|bh|none] [--json [FILE]] [--csv [FILE]]`
"""

from analysis.cli import _common, _export_arguments, cmd_compare


def add_arguments(parser) -> None:
    _common(parser)
    _export_arguments(parser)


def run(args) -> int:
    return cmd_compare(args)
