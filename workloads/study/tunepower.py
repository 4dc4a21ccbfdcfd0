"""What a tune's confirmation can call, from the noise its own search measured, and the level of
several tunes read together (docs/tune.md, "How many blocks the confirmation gets").

The confirmation is planned before anything runs at a CV that is declared or a catalog default:
a guess. By the time it starts, the search's rounds have measured the noise of these very runs:
each round is candidates x blocks of one workload, so the residual of a two-way fit (log value
less its candidate's mean and its block's mean) is a run's own noise, with the candidates' real
differences and the blocks' drift both removed, on (b - 1)(k - 1) degrees of freedom. The
confirmation is then sized on that sd's 80% upper limit, as a study's plan sizes on earlier
studies (workloads/study/plan.py), so what it prints it can call is what it can call (at the
upper limit it is, for at least 80% of tunes). Its block count depends only on the search's
data, which are independent of the confirmation's own blocks, so the confirmation keeps its level.

Several tunes in one study each name a winner at their own alpha; read together, the chance of
at least one false winner grows with their number. A study names its tunes before it runs them,
so it runs each at alpha / T (Bonferroni) and, reading their results, corrects the T tunes'
confirmation p-values by Holm; a winner that does not survive runs at its default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from analysis import stats

# the most blocks a re-sized confirmation runs unless confirm.blocks asks for more (a noise that
# would need more is said, with the blocks it would need)
MOST_BLOCKS = 24
# an estimate below this multiple of its test's MDE is said to be near it: among confirmations
# that pass, such an estimate is inflated by the significance filter (a true +5% printed +7.5%)
NEAR_MDE = 1.5


def residual_sd(rounds: Sequence[Mapping[str, Sequence[float | None]]]) -> tuple[float, int]:
    """(pooled residual sd, its degrees of freedom) of log values over the search's rounds of one
    workload: each round's candidate -> log value per block (None: missing; a block without every
    candidate is left out). Rounds with fewer than two complete blocks or two candidates add nothing."""
    ss, df = 0.0, 0
    for logs in rounds:
        names = list(logs)
        if len(names) < 2:
            continue
        blocks = min(len(v) for v in logs.values())
        full = [b for b in range(blocks) if all(logs[n][b] is not None for n in names)]
        if len(full) < 2:
            continue
        x = np.array([[logs[n][b] for n in names] for b in full], dtype=float)  # (blocks, candidates)
        r = x - x.mean(axis=0) - x.mean(axis=1, keepdims=True) + x.mean()
        ss += float((r ** 2).sum())
        df += (len(full) - 1) * (len(names) - 1)
    return (math.sqrt(ss / df), df) if df else (math.nan, 0)


def upper(sd: float, df: int) -> float:
    """80% upper confidence limit of an sd estimated with `df` degrees of freedom: sd x
    sqrt(df / chi2_0.2(df)) (x1.6 at 4 df, x1.16 at 23, x1.06 at 120); the study plan's too."""
    from scipy import stats as sps

    return sd * math.sqrt(df / sps.chi2.ppf(0.2, df))


@dataclass(frozen=True)
class Confirm:
    blocks: int
    cv: float            # the CV the blocks are sized on: the measured one's 80% upper limit, else the planned
    measured: bool
    mde: float           # what the blocks call with 80% power at that CV (a fraction)
    alpha: float         # the level the confirmation is judged at (alpha / tunes in the family)
    line: str


def size(noise: Sequence[tuple[float, int]], planned_blocks: int, given: bool, planned_cv: float, detect: float,
         tests: int, alpha: float, family: int = 1) -> Confirm:
    """The confirmation's blocks from the search's measured noise, one (sd, df) per workload:
    sized on the largest workload's 80% upper limit; the blocks declared (`given`) are kept and
    said to fall short when they cannot call `detect` at that noise; the planned ones are
    replaced by the fewest that can (at most MOST_BLOCKS)."""
    level = alpha / max(family, 1)
    fam = f"alpha {alpha:g}/{family} (one of {family} tunes)" if family > 1 else f"alpha {alpha:g}"
    ups = [(upper(sd, df), sd, df) for sd, df in noise if df > 0 and math.isfinite(sd)]
    if not ups:
        mde = stats.plan_mde(planned_blocks, tests, planned_cv, level)
        return Confirm(planned_blocks, planned_cv, False, mde, level,
                       f"confirm: {planned_blocks} blocks, can call >= {stats.pct(mde)} with 80% power at the planned "
                       f"CV {stats.pct(planned_cv)} (the search had no round of two complete blocks to measure the "
                       f"noise), judged at {fam}")
    cv, sd, df = max(ups)
    need = stats.blocks_for(detect, tests, cv, level, most=max(MOST_BLOCKS, planned_blocks))
    blocks = planned_blocks if given else (need or max(MOST_BLOCKS, planned_blocks))
    mde = stats.plan_mde(blocks, tests, cv, level)
    line = (f"confirm: {blocks} blocks, can call >= {stats.pct(mde)} with 80% power at CV {stats.pct(cv)} (the 80% "
            f"upper limit of the {stats.pct(sd)} the search's rounds measured, {df} df; planned at "
            f"{stats.pct(planned_cv)}), judged at {fam}")
    if mde > detect:
        more = stats.blocks_for(detect, tests, cv, level)
        line += (f"; it cannot call detect {stats.pct(detect)} at this noise"
                 + (f": that needs {more} blocks (confirm: {{blocks: {more}}})" if more else
                    ": no confirmation up to 200 blocks can"))
    return Confirm(blocks, cv, True, mde, level, line)


def gain(c: stats.Comparison) -> str:
    """A confirmed gain as the claim its interval supports: the end nearest no change ('at least'),
    then the estimate and interval, and a word when the estimate is near the test's MDE."""
    end = min((c.lo, c.hi), key=lambda v: abs(math.log(v)))  # a confirmed gain's interval excludes 1
    text = (f"{c.metric} at least {100 * (end - 1):+.1f}% (estimate {100 * (c.ratio - 1):+.1f}% "
            f"[{100 * (c.lo - 1):+.1f}%, {100 * (c.hi - 1):+.1f}%])")
    if math.isfinite(c.mde) and abs(c.speedup - 1) < NEAR_MDE * c.mde:
        text += (f"; near this test's MDE of {stats.pct(c.mde)}, where a confirmed estimate is inflated (only the "
                 "lucky draws pass): read the lower end")
    return text


def tune_p(comparisons: Sequence[stats.Comparison]) -> float:
    """The tune's own p-value for "the winner is ahead": the smallest corrected p of a verdict in
    the winner's favour, 1 when none is or one is against it."""
    cs = [c for c in comparisons if math.isfinite(c.p_adj)]
    if any(c.significant and c.speedup < 1 for c in cs):
        return 1.0
    ahead = [c.p_adj for c in cs if c.speedup > 1]
    return min(ahead) if ahead else 1.0


def family_keep(ps: Sequence[float], alpha: float) -> list[bool]:
    """Which of T tunes' winners stand once the T are read together: Holm over their p-values."""
    if len(ps) < 2:
        return [p <= alpha for p in ps]
    return [bool(a <= alpha) for a in stats.holm(ps)]


def note(tune: Mapping, family: int, dropped: bool) -> str:
    """One line of a study's plan for a tuned arm: its tune's outcome, the level it was judged at
    and what its confirmation could call; `dropped`: the family's correction did not keep it."""
    level = tune.get("level")
    mde = tune.get("mde")
    text = f"tune {tune.get('id')}: {tune.get('outcome')}" + (f" ({tune.get('candidate')})"
                                                              if tune.get("outcome") == "winner" else "")
    if level is not None:
        text += f", judged at alpha {float(level):.4g}"
    if family > 1:
        text += f", one of {family} tunes corrected together (Holm over their p-values)"
    if mde is not None:
        text += f"; its confirmation could call >= {stats.pct(float(mde))} with 80% power"
        if tune.get("outcome") != "winner":
            text += " (a smaller gain may be there: untuned)"
    if dropped:
        text += f"; its winner's p {float(tune.get('p', 1.0)):.3g} does not stand in the family: the arm runs at its default"
    return text
