"""Compare fabrics point by point: verdicts with 95% intervals, refused pairs named.

    fabricbench compare results/run-a results/run-b --baseline loopback
    fabricbench compare --wandb my-team/fabricbench --group pretrain-neox-1.3b-zero1-ws16 --json verdicts.json

`fabricbench compare DIR... [--wandb entity/project] [--baseline ARM] [--allow KEY]
[--correction holm|bh|none] [--json [FILE]] [--csv [FILE]]`. What it reads and prints (the
loading, the verdict lines, the exports) is `fabricbench report`'s too (commands/report.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from workloads.core.errors import UsageError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="*", help="directories holding result records (searched recursively)")
    p.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also read runs from this W&B project")
    p.add_argument("--group", help="W&B group to read")
    p.add_argument("--tag", action="append", default=[], help="W&B tag the runs must carry (repeatable)")
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                   help="W&B config filter on the logger's flat keys, e.g. fabric/name=roce (repeatable)")
    p.add_argument("--baseline", help="the arm the others are compared against: a study's arm label, else the fabric's "
                                      "name (default: the first by name)")
    p.add_argument("--allow", action="append", default=[], metavar="KEY",
                   help="identity key (dotted, prefix or glob) allowed to differ between compared runs (repeatable)")
    p.add_argument("--metric", action="append", default=None, help="metric to compare (default: the workload's headline ones)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also list the points no other fabric reached (by default only counted)")
    p.add_argument("--alpha", type=float, default=None,
                   help="significance level (default: the one a study's records were planned at, else 0.05)")
    p.add_argument("--correction", default="holm", choices=["holm", "bh", "none"],
                   help="over every verdict of a study: holm (family-wise error, default), bh (Benjamini-Hochberg "
                        "false-discovery rate) or none")


def _load(args):
    from analysis.load import load_table
    from analysis.verdicts import judge

    if not args.dirs and not args.wandb:
        raise UsageError("nothing to read: pass result directories and/or --wandb entity/project")
    config = {}
    for f in args.filter:
        k, eq, v = f.partition("=")
        if not eq:
            raise UsageError(f"--filter {f!r}: write KEY=VALUE")
        config[k] = v
    table = load_table(args.dirs, args.wandb, args.group, args.tag, config)
    result = judge(table, args.baseline, args.allow, args.metric, args.alpha, args.correction,
                   where=", ".join(args.dirs) or args.wandb)
    return table, result


def _print(result, verbose: bool = False, dirs: Sequence[str] = ()) -> None:
    from analysis.verdicts import lines

    for line in lines(result, verbose, dirs):
        print(line)


def _exports(args, result) -> bool:
    """Write --json/--csv; True when one of them went to stdout (then it is all stdout holds)."""
    from analysis import export

    outs = {"json": getattr(args, "json", None), "csv": getattr(args, "csv", None)}
    if list(outs.values()).count("-") > 1:
        raise UsageError("--json and --csv cannot both go to stdout; give one of them a file name")
    for kind, dest in outs.items():
        if dest is None:
            continue
        text = export.to_json(result) if kind == "json" else export.to_csv(result)
        if dest == "-":
            sys.stdout.write(text)
        else:
            try:
                Path(dest).write_text(text)
            except OSError as e:
                raise UsageError(f"--{kind} {dest}: cannot write ({e.strerror}); give a writable file name") from None
    return "-" in outs.values()


def cmd_compare(args) -> int:
    from analysis.verdicts import unjudged

    table, result = _load(args)
    if not _exports(args, result):
        _print(result, getattr(args, "verbose", False), args.dirs)
    if (why := unjudged(table, result)) is not None:
        raise UsageError(why)
    return 0


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="write every verdict as JSON to FILE (no FILE: to stdout, instead of the text)")
    p.add_argument("--csv", nargs="?", const="-", metavar="FILE",
                   help="one CSV row per verdict (workload, point, metric, baseline, other, ratio, lo, hi, p, "
                        "p_corrected, n, design, ...) to FILE (no FILE: to stdout, instead of the text)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    _export_arguments(parser)


def run(args) -> int:
    return cmd_compare(args)
