"""`fabricbench tune SPEC`: each fabric at its best, with a verdict.

    fabricbench tune conf/tune/emu-cc.yaml          # or a name from conf/tune/
    fabricbench tune my-tune.yaml --plan            # the plan and its number of runs; nothing runs
    fabricbench tune my-tune.yaml --id cc-0601 --output-root /shared/results

Successive halving over the candidates' settings, interleaved, then the winner against the
default on fresh blocks, judged by the study's verdict code; writes the tuned arm a study names
(`arms: [{tuned: results/<tune id>}]`). The machinery: workloads/study/tune.py; docs/tune.md.
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    from workloads.commands.study import common_arguments

    common_arguments(parser, "tune")
    parser.add_argument("--plan", action="store_true", help="print the plan (candidates, rounds, runs) and stop")


def run(args) -> int:
    """Tune an arm's settings: successive halving, then the winner against the default on fresh blocks."""
    from workloads.commands.study import interruptible
    from workloads.study.tune import run_tune
    from workloads.study.tunespec import load_tune

    tune = load_tune(args.tune, args.id, args.output_root)
    return interruptible(lambda: run_tune(tune, args.launcher, plan_only=args.plan))
