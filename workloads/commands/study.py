"""`fabricbench study SPEC`: arms x workloads x blocks, interleaved; then compare and report.

    fabricbench study conf/study/emu-ab.yaml            # or just: fabricbench study emu-ab
    fabricbench study my-study.yaml --id ab-2024-06-01 --output-root /shared/results
    fabricbench study emu-ab --plan                     # the plan only: tests, noise, MDE, blocks, time
    fabricbench study emu-ab --plan --pilot             # ... after one block, for the wall time and sbatch --time
    fabricbench study emu-ab --until-decided --max-blocks 16   # add blocks until every verdict is decided

The study itself, its runner and its tables, is workloads/study/run.py (docs/studies.md). Here,
before it: a study whose tuned arms name tune specs (`arms: [{tuned: conf/tune/ib.yaml},
{tuned: roce-tune}]`) runs each tune that has not run yet under the study's output root
(`fabricbench tune`, resumed where it stopped), then the study over the tuned arms, in one
command; `--plan` prints the tunes' plans.

Exit status: 0 every cell ok, 1 a cell failed (the others still ran), 2 bad input,
130 interrupted by Ctrl-C, 143 by SIGTERM (finished cells are kept; rerun to continue).
"""

from __future__ import annotations

import argparse
import signal
import sys

from workloads.core.errors import Fault, UsageError


def add_arguments(parser) -> None:
    common_arguments(parser, "study")
    parser.add_argument("--plan", action="store_true",
                        help="print the plan (tests, expected noise, detectable difference, blocks, wall time) and stop")
    parser.add_argument("--pilot", action="store_true",
                        help="run one block of every arm x workload first (a study of its own, <id>-pilot), then "
                             "print the plan with the wall time and the sbatch --time it measured; implies --plan")
    parser.add_argument("--until-decided", action="store_true",
                        help="add blocks until every primary verdict is settled: faster, slower or equivalent (see "
                             "--stop-on; needs --max-blocks)")
    parser.add_argument("--max-blocks", type=int, metavar="N", help="the most blocks a --until-decided study runs")
    # its name before, read for a release with a deprecation line; not shown by --help
    parser.add_argument("--max-trials", type=int, dest="max_trials", help=argparse.SUPPRESS)
    parser.add_argument("--stop-on", metavar="WHAT", default=None,
                        help="what settles a verdict of --until-decided: a comma-separated subset of difference, "
                             "equivalence, futility (a `detect`-sized difference ruled out: fewer blocks, but a true "
                             "difference below detect is then rarely called); default difference,equivalence")


def common_arguments(parser, kind: str) -> None:
    """What `fabricbench study` and `fabricbench tune` both take: the file, its id, where it goes, the launcher."""
    parser.add_argument(kind, help=f"a {kind} YAML file, or the name of one in conf/{kind}/")
    parser.add_argument("--id", help=f"{kind} id (default: the file's id or name); a rerun with the same id resumes")
    parser.add_argument("--output-root", help=f"where the {kind}'s folder goes (default: the file's, else results)")
    parser.add_argument("--launcher", choices=["auto", "local", "slurm"], default="auto",
                        help="auto: one Slurm step per run inside an allocation (SLURM_JOB_ID set), else local")


def run(args) -> int:
    """Run an A/B study: arms x workloads x blocks, counterbalanced and interleaved; its tunes first."""
    from workloads.study.fabrics import keeping
    from workloads.study.spec import TuneFirst, load_spec

    keeping()  # a wrong FB_STUDY_KEEP_FABRIC is refused before the plan and the study's folder
    ran: set[str] = set()
    while True:
        try:
            spec = load_spec(args.study, args.id, args.output_root)
            break
        except TuneFirst as e:
            code = _tunes_first(e, ran, args)
            if code is not None:
                return code
    return _study(spec, args)


def _study(spec, args) -> int:
    from workloads.study.run import run_study

    max_blocks = _max_blocks(args)
    if args.until_decided != (max_blocks is not None):
        raise UsageError("--until-decided and --max-blocks N go together: a sequential study needs its cap")
    stop_on = None
    if args.stop_on is not None:
        from analysis import looks

        if not args.until_decided:
            raise UsageError("--stop-on goes with --until-decided --max-blocks N: only a sequential study stops early")
        try:
            stop_on = looks.stop_on(args.stop_on)
        except ValueError as e:
            raise UsageError(str(e)) from None
    pilot = getattr(args, "pilot", False)
    return interruptible(lambda: run_study(spec, args.launcher, plan_only=args.plan or pilot, max_blocks=max_blocks,
                                           stop_on=stop_on, pilot=pilot))


def _max_blocks(args) -> int | None:
    """--max-blocks, or --max-trials (its name before) with one deprecation line; both is refused."""
    old = getattr(args, "max_trials", None)
    if old is None:
        return args.max_blocks
    if args.max_blocks is not None:
        raise UsageError(f"--max-blocks {args.max_blocks} and --max-trials {old} are one option (--max-trials is its "
                         "name before); give --max-blocks only")
    print("--max-trials is deprecated, read for this release: write --max-blocks", file=sys.stderr)
    return old


def _tunes_first(e, ran: set[str], args) -> int | None:
    """Run (or, with --plan, plan) the tunes the study's arms wait for: an exit code to stop at,
    or None to load the study again."""
    from workloads.study.tune import run_tune
    from workloads.study.tunespec import load_tune

    for tune_file, root in e.tunes:
        if tune_file in ran:  # it ran and still left no tuned arm
            raise Fault(f"tune {tune_file} ran but wrote no tuned.yaml under {root}; see its output above, "
                             "fix it and rerun")
        ran.add(tune_file)
        tune = load_tune(tune_file, output_root=root)
        print(f"study {args.study}: arm tuned by {tune_file}: {'its plan' if args.plan else 'tuning it first'}")
        code = interruptible(lambda: run_tune(tune, args.launcher, plan_only=args.plan, family=e.family))
        if code:
            return code
    if args.plan:
        print("the study's own plan follows once its tunes have run (run the study without --plan: it tunes first)")
        return 0
    return None


def interruptible(call) -> int:
    """call() with SIGTERM as an interrupt: Ctrl-C or SIGTERM ends it with one line and 130/143,
    the finished runs kept for a rerun to continue from (a study's or a tune's)."""
    old = signal.signal(signal.SIGTERM, _sigterm)
    try:
        return call()
    except KeyboardInterrupt as e:
        print("interrupted: finished runs are kept; rerun the same command to continue", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    finally:
        signal.signal(signal.SIGTERM, old)


def _sigterm(signum, frame):
    from workloads.core.signals import Terminated

    raise Terminated(f"received signal {signum}")  # a KeyboardInterrupt that exits 143, as docs/reliability.md says
