"""Blocks a study spends: `--until-decided` against the fixed plan, at the same error rates.

    .venv/bin/python benchmarks/sequential_study.py [--studies 300] [--seed 0]

Simulated with the project's own verdict code (analysis.stats.compare and correct, the looks and
alpha shares of analysis/looks.py, the stop rule analysis.looks.stops): two primary verdicts
(e.g. training and all_reduce), CV 5% per run, alpha 0.05, detect 10%. The fixed design runs the
blocks the plan chooses (8); the sequential one looks after 3, 4, 6, 8, 12, 16 blocks, spending
alpha x 3/49, 4/49, ..., 16/49 there, and stops when both verdicts are settled: by default a
difference called or equivalent within 2%; with `--stop-on ...,futility` also a 10% difference
ruled out by the interval. For each true difference it prints the power (first verdict called),
any false call of the second, and the mean blocks used, with the ratio sequential / fixed; first
with the difference in one metric and the other equal, then in both (a slower fabric usually
slows training and the collective alike). The GPU-hours a study costs are proportional to its
blocks.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis import looks as sched  # noqa: E402
from analysis import stats  # noqa: E402

CV, DETECT, TESTS, ALPHA = 0.05, 0.10, 2, 0.05
RULES = (sched.STOP_ON, sched.STOPS)   # the default, and with futility


def verdicts(d: np.ndarray, looks: int, share: float = math.nan) -> list[stats.Comparison]:
    fam = [stats.compare([1.0] * d.shape[1], [1.0] * d.shape[1], f"arm{i}", "base", "samples_per_sec", design=stats.Design(blocks=d[i], name="sim"), judging=stats.Judging(looks=looks, share=share)) for i in range(d.shape[0])]
    return stats.correct(fam, "holm", ALPHA)


def one(rng: np.random.Generator, effect: float, fixed: int, cap: int, both: bool) -> tuple[tuple, ...]:
    """(called, false call, blocks) of the fixed design, then of the sequential one under each rule."""
    shift = np.array([[math.log1p(effect)], [math.log1p(effect) if both else 0.0]])
    d = shift + rng.normal(0, CV, (TESTS, cap)) - rng.normal(0, CV, (TESTS, cap))
    f = verdicts(d[:, :fixed], 1)
    out: list = [(f[0].significant, f[1].significant, fixed), None, None]
    looks = sched.looks_at(cap)
    for k in looks:
        s = verdicts(d[:, :k], len(looks), sched.share(looks, k))
        for i, rule in enumerate(RULES, 1):
            if out[i] is None and (all(sched.stops(c, rule) for c in s) or k == looks[-1]):
                out[i] = (s[0].significant, s[1].significant, k)
        if all(out):
            break
    return tuple(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-blocks", type=int, default=16)
    args = ap.parse_args()
    fixed = stats.blocks_for(DETECT, TESTS, CV, ALPHA)
    rng = np.random.default_rng(args.seed)
    print(f"fixed plan: {fixed} blocks; sequential: looks after {sched.looks_at(args.max_blocks)} blocks; "
          f"{args.studies} studies per row; CV {CV:.0%}, {TESTS} primary tests, alpha {ALPHA}")
    for both in (False, True):
        print(f"\ndifference in {'both metrics' if both else 'the first metric, the second equal'} "
              f"({'second' if both else 'false'}: the second verdict called); each cell: power second blocks")
        print(f"{'true difference':>16} | {'fixed':>18} | {'sequential (default)':>24} | {'with futility':>24} | "
              f"blocks ratio (default, futility)")
        for effect in ((0.05, 0.10, 0.30, 1.0) if both else (0.0, 0.02, 0.05, 0.10, 0.30, 1.0)):
            runs = np.array([one(rng, effect, fixed, args.max_blocks, both) for _ in range(args.studies)], dtype=float)
            cells = [f"{runs[:, i, 0].mean():.2f} {runs[:, i, 1].mean():.3f} {runs[:, i, 2].mean():4.1f}" for i in range(3)]
            print(f"{effect:>16.0%} | {cells[0]:>18} | {cells[1]:>24} | {cells[2]:>24} | "
                  f"{runs[:, 1, 2].mean() / fixed:.2f}, {runs[:, 2, 2].mean() / fixed:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
