"""`fabricbench study SPEC`: arms x workloads x trials, interleaved; then compare and report.

The study itself is workloads/study/run.py (docs/studies.md). Here, before it: a study whose
tuned arms name tune specs (`arms: [{tuned: conf/tune/ib.yaml}, {tuned: roce-tune}]`) runs each
tune that has not run yet under the study's output root (`fabricbench tune`, resumed where it
stopped), then the study over the tuned arms, in one command; `--plan` prints the tunes' plans.
"""

from __future__ import annotations

from workloads.study.run import add_arguments  # noqa: F401  (the study's options)


def run(args) -> int:
    from workloads.study import run as study
    from workloads.study.fabrics import keeping
    from workloads.study.spec import TuneFirst, load_spec

    keeping()  # a wrong FB_STUDY_KEEP_FABRIC is refused before the plan and the study's folder
    ran: set[str] = set()
    while True:
        try:
            load_spec(args.study, args.id, args.output_root)
            break
        except TuneFirst as e:
            code = _tunes_first(e, ran, args)
            if code is not None:
                return code
    return study.run(args)


def _tunes_first(e, ran: set[str], args) -> int | None:
    """Run (or, with --plan, plan) the tunes the study's arms wait for: an exit code to stop at,
    or None to load the study again."""
    from workloads.core.errors import Fault
    from workloads.study.run import interruptible
    from workloads.study.tune import run_tune
    from workloads.study.tunespec import load_tune

    for tune_file, root in e.tunes:
        if tune_file in ran:  # it ran and still left no tuned arm
            raise Fault(f"tune {tune_file} ran but wrote no tuned.yaml under {root}; see its output above, "
                             "fix it and rerun")
        ran.add(tune_file)
        tune = load_tune(tune_file, output_root=root)
        print(f"study {args.study}: arm tuned by {tune_file}: {'its plan' if args.plan else 'tuning it first'}")
        code = interruptible(lambda: run_tune(tune, args.launcher, plan_only=args.plan))
        if code:
            return code
    if args.plan:
        print("the study's own plan follows once its tunes have run (run the study without --plan: it tunes first)")
        return 0
    return None
