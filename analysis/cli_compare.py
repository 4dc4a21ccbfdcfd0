"""Compare fabrics point by point: verdicts with 95% intervals, refused pairs named.

`fabricbench compare DIR... [--wandb entity/project] [--baseline FABRIC] [--allow KEY]`
"""

from analysis.cli import _common, cmd_compare


def add_arguments(parser) -> None:
    _common(parser)


def run(args) -> int:
    return cmd_compare(args)
