"""The looks of a sequential study and the share of alpha each spends (no scipy: the planner
imports it before any statistics are needed).

A study that may stop at any of its planned looks spends alpha over them: look j, after k_j
blocks, judges its family at alpha x k_j / (k_1 + ... + k_L). The shares sum to 1, so by
Bonferroni over the looks the chance of any false call at any look, and so at whichever look
the study stops, is at most alpha; the intervals of each look at its own level cover together
with at least 1 - alpha. Weighting by blocks puts little alpha on the early looks, where few
blocks could call only a large difference anyway, and most on the late ones, where a small
difference is decided: against an equal alpha/L per look, power for a true +5% (CV 5%, cap 16)
rises from 49% to 59% (tests/analysis/test_power.py). It is fixed by the schedule alone, before
any data are seen, so no look can change what a later look spends.
"""

from __future__ import annotations

FIRST_LOOK = 3
STOPS = ("difference", "equivalence", "futility")
STOP_ON = ("difference", "equivalence")   # the default: futility ("ruled out detect") costs power below detect


def looks_at(max_blocks: int, first: int = FIRST_LOOK) -> list[int]:
    """The blocks after which a sequential study looks: 3, 4, then x1.5 and x4/3 in turn (6, 8,
    12, 18, 24, 36, ...: few looks keep each look's alpha large), those below the cap, and always
    the cap (16 gives 3, 4, 6, 8, 12, 16)."""
    out, k = [], first
    while k < max_blocks:
        out.append(k)
        k = k + 1 if k < 4 else (k * 3 // 2 if k % 4 == 0 else k * 4 // 3)
    return [*out, max_blocks]


def share(schedule: list[int], blocks: int) -> float:
    """The fraction of alpha spent at the look that judges `blocks` blocks: that look is the
    first of `schedule` at or past `blocks` (a look whose last runs failed is still that look;
    past the cap, the cap), and its share is its blocks over the schedule's total."""
    k = next((j for j in schedule if j >= blocks), schedule[-1])
    return k / sum(schedule)


def stop_on(text: str) -> tuple[str, ...]:
    """`--stop-on difference,equivalence[,futility]` as a tuple; ValueError naming the fix."""
    got = tuple(w.strip() for w in text.split(",") if w.strip())
    bad = [w for w in got if w not in STOPS]
    if bad or not got:
        raise ValueError(f"--stop-on {text}: a comma-separated subset of {', '.join(STOPS)} "
                         f"(the default is {','.join(STOP_ON)})")
    return got


def stops(c, on: tuple[str, ...] = STOP_ON) -> bool:
    """Whether a primary verdict (an analysis.stats.Comparison) lets a sequential study stop:
    a difference called, equivalence within the margin, or, only when asked for, a difference
    of `detect` ruled out by the interval (futility). Futility is not the default: a study that
    stops once `detect` is ruled out leaves a true difference below `detect` uncalled (a true 2%
    at CV 1% was called in 10% of studies, against 97% at the cap)."""
    return bool(("difference" in on and c.significant) or ("equivalence" in on and c.equivalent)
                or ("futility" in on and c.rules_out))
