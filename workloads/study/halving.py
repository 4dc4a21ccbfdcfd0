"""A tune's two phases as pure functions, shared by `fabricbench tune` and its simulation tests.

Search: successive halving. Every round measures its candidates in interleaved blocks (each
block runs every candidate once, in an order rotated from block to block: a Williams square,
workloads/study/schedule.py), scores each candidate by its mean within-block log difference
from the block's mean (so a drift of the machine moves every candidate of a block alike and
cancels), and keeps the better half. The last one standing is the winner.

Confirm: the winner against the default on fresh blocks, judged by the study's verdict code
(analysis.stats through analysis.compare). The search's own figures are biased upward: the
winner is the candidate whose noise happened to be kindest (the winner's curse), so they are
never reported as the gain; only the confirmation's interval is, and it says among how many
candidates the winner was chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from analysis import stats

# the outcome's words (tuned.yaml `outcome`)
WINNER, EQUIVALENT, DEFAULT_AHEAD, INCONCLUSIVE, KEPT = ("winner", "equivalent", "default-ahead", "inconclusive",
                                                          "default-kept")


def block_scores(logs: Mapping[str, Sequence[float | None]], higher_is_better: bool) -> dict[str, float]:
    """Each candidate's mean within-block difference of log values from the block's mean,
    signed so that larger is better. `logs`: candidate -> log value per block (None: missing,
    that block is left out for every candidate)."""
    names = list(logs)
    blocks = min(len(v) for v in logs.values())
    full = [b for b in range(blocks) if all(logs[n][b] is not None for n in names)]
    if not full:
        return {n: math.nan for n in names}
    sign = 1.0 if higher_is_better else -1.0
    out = {n: 0.0 for n in names}
    for b in full:
        mean = sum(logs[n][b] for n in names) / len(names)
        for n in names:
            out[n] += sign * (logs[n][b] - mean) / len(full)
    return out


def keep(scores: Mapping[str, float], order: Sequence[str]) -> list[str]:
    """The better half (rounded up) by score; ties keep the earlier candidate in `order`."""
    k = math.ceil(len(order) / 2)
    ranked = sorted(order, key=lambda n: (-scores[n], order.index(n)))
    return [n for n in order if n in ranked[:k]]


def successive_halving(names: Sequence[str], blocks: Sequence[int],
                       measure: Callable[[int, list[str], int], dict[str, float]]) -> tuple[str, list[dict[str, float]]]:
    """(winner, each round's scores). measure(round, candidates, blocks) -> score per candidate
    (block_scores of that round's measurements); a NaN score (a round with no complete block)
    raises ValueError: no candidate may win by a failed run."""
    alive, history = list(names), []
    for r, b in enumerate(blocks):
        if len(alive) == 1:
            break
        scores = measure(r, alive, b)
        if any(math.isnan(scores[n]) for n in alive):
            raise ValueError(f"round {r + 1}: no block holds a run of every candidate")
        history.append(scores)
        alive = keep(scores, alive)
    if len(alive) != 1:
        raise ValueError(f"successive halving ended with {len(alive)} candidates; the rounds were planned for fewer")
    return alive[0], history


@dataclass(frozen=True)
class Outcome:
    kind: str                      # WINNER, EQUIVALENT, DEFAULT_AHEAD, INCONCLUSIVE or KEPT
    winner: str                    # the search's winner (the default when KEPT)
    sentence: str                  # what the tune says, one line per workload point after the first
    comparisons: tuple = ()        # the confirmation's primary verdicts

    @property
    def adopted(self) -> bool:
        """The winner's settings become the tuned arm's only when the confirmation called them ahead."""
        return self.kind == WINNER


def _gain(c: stats.Comparison) -> str:
    """'samples_per_sec at least +8.1% (estimate +12.3% [+8.1%, +16.4%])': the winner's value over the
    default's, minus 1, in the metric's own direction (a latency that fell is negative), the
    interval's end nearest no change first (workloads/study/tunepower.py)."""
    from workloads.study import tunepower

    return tunepower.gain(c)


def outcome(winner: str, default: str, among: int, comparisons: Sequence[stats.Comparison]) -> Outcome:
    """What the confirmation says, from its primary verdicts (one per workload point, one Holm
    family): a winner when at least one calls the winner ahead and none calls it behind; the
    default ahead when one calls it behind; equivalent when every one is equivalent within the
    margin; else inconclusive."""
    if winner == default:
        return Outcome(KEPT, default, f"the search kept the default (chosen among {among}): nothing to confirm; "
                       "the tuned arm is the arm as it is")
    cs = tuple(comparisons)
    if not cs:
        return Outcome(INCONCLUSIVE, winner, f"inconclusive: the confirmation of {winner} holds no verdict "
                       "(no complete block); rerun to measure the missing runs")
    ahead = [c for c in cs if c.significant and c.speedup > 1]
    behind = [c for c in cs if c.significant and c.speedup < 1]
    detail = "; ".join(f"{c.metric}: {c.verdict}" for c in cs)
    how = (f"{cs[0].blocks} fresh blocks, {cs[0].conf * 100:.4g}% CI"
           + (f", Holm over {cs[0].family}" if cs[0].family > 1 else ""))
    if ahead and not behind:
        gains = ", ".join(_gain(c) for c in ahead)
        return Outcome(WINNER, winner, f"winner {winner}: {gains} against the default ({how}), chosen among {among}",
                       cs)
    if behind:
        return Outcome(DEFAULT_AHEAD, winner, f"the default is ahead of the search's winner {winner} on fresh blocks "
                       f"(chosen among {among}: the search's lead was noise or drift): {detail}", cs)
    if all(c.equivalent for c in cs):
        return Outcome(EQUIVALENT, winner, f"default equivalent within ±{stats.pct(cs[0].margin)}: {winner} (chosen "
                       f"among {among}) is no better on fresh blocks ({how}); {detail}", cs)
    return Outcome(INCONCLUSIVE, winner, f"inconclusive: {winner} (chosen among {among}) against the default ({how}): "
                   f"{detail}", cs)
