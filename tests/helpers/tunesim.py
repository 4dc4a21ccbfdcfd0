"""Simulated tunes through the tune's own code: successive halving (workloads/study/halving.py)
over candidates measured with noise and drift, then the confirmation judged by the study's
verdict code (analysis.stats.compare and correct) and put into words by halving.outcome.

A run's log value is: the candidate's true effect + the block's drift (every run of a block
shares it: the machine got slower or faster between blocks) + noise (sd `cv`). The search and the
confirmation draw fresh blocks; `reuse=True` judges the winner on the very blocks that chose it
instead, the mistake the separate confirmation exists to avoid (the winner's curse).

    .venv/bin/python -c "import sys; sys.path.insert(0, 'tests'); from helpers.tunesim import main; main()"
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis import stats
from workloads.study import halving, tunepower
from workloads.study.tunespec import DEFAULT, round_blocks, rounds


@dataclass(frozen=True)
class Tune:
    outcome: halving.Outcome
    search_gain: float          # the winner's last search score against the default's, had it been reported (log)
    confirmed_gain: float       # the confirmation's estimate (log), 0 when there was none
    confirm: tunepower.Confirm | None = None   # the confirmation as re-sized from the search's noise (resize=True)
    p: float = 1.0              # the tune's p-value for "the winner is ahead" (tunepower.tune_p)


def simulate(rng: np.random.Generator, effects: dict[str, float], cv: float = 0.05, drift: float = 0.05,
             confirm_blocks: int = 6, search_budget: int | None = None, reuse: bool = False,
             alpha: float = 0.05, resize: bool = False, planned_cv: float | None = None, detect: float = 0.10,
             family: int = 1, at_mde: bool = False) -> Tune:
    """One tune over candidates with true log effects `effects` (the default's is 0).

    resize: the confirmation is sized as `fabricbench tune` sizes it, from the search rounds'
    measured noise (tunepower.size, planned at `planned_cv`, one of `family` tunes); at_mde: the
    winner's true gain in the confirmation is the MDE that sizing printed (the power it claims)."""
    names = [DEFAULT, *[n for n in effects if n != DEFAULT]]
    true = {n: effects.get(n, 0.0) for n in names}
    budget = search_budget or len(rounds(len(names))) * len(names)
    blocks = round_blocks(len(names), 1, budget)
    seen: dict[str, list[float]] = {}     # the last round's draws of each candidate, for `reuse`
    rounds_seen: list[dict[str, list[float]]] = []

    def measure(r: int, alive: list[str], b: int) -> dict[str, float]:
        shift = rng.normal(0, drift, b)
        logs = {n: list(true[n] + shift + rng.normal(0, cv, b)) for n in alive}
        seen.update(logs)
        rounds_seen.append(logs)
        return halving.block_scores(logs, higher_is_better=True)

    winner, history = halving.successive_halving(names, blocks, measure)
    last = history[-1] if history else {}
    search_gain = last.get(winner, 0.0) - last.get(DEFAULT, min(last.values(), default=0.0))
    conf, level = None, alpha
    if resize:
        conf = tunepower.size([tunepower.residual_sd(rounds_seen)], confirm_blocks, False,
                              cv if planned_cv is None else planned_cv, detect, 1, alpha, family)
        confirm_blocks, level = conf.blocks, conf.alpha
        if at_mde:
            true[winner] = math.log1p(conf.mde)
    if winner == DEFAULT:
        return Tune(halving.outcome(winner, DEFAULT, len(names), []), search_gain, 0.0, conf)
    if reuse and DEFAULT in seen:
        w, d = np.array(seen[winner]), np.array(seen[DEFAULT])
    else:
        shift = rng.normal(0, drift, confirm_blocks)
        w = true[winner] + shift + rng.normal(0, cv, confirm_blocks)
        d = shift + rng.normal(0, cv, confirm_blocks)
    c = stats.compare(np.exp(w), np.exp(d), winner, DEFAULT, "samples_per_sec", design=stats.Design(blocks=w - d, name="sim"), judging=stats.Judging(alpha=level))
    c = stats.correct([c], "holm", level)[0]
    return Tune(halving.outcome(winner, DEFAULT, len(names), [c]), search_gain, float(np.mean(w - d)), conf,
                tunepower.tune_p([c]))


def rate(kind: str, tunes: list[Tune]) -> float:
    return sum(t.outcome.kind == kind for t in tunes) / len(tunes)


def main(n: int = 1000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    blocks = stats.blocks_for(0.10, 1, 0.05)
    print(f"{n} simulated tunes per row; CV 5%, drift sd 5% between blocks; confirmation {blocks} fresh blocks "
          "(the plan's for detect 10%)")
    rows = [("planted null: 4 identical candidates", {"a": 0.0, "b": 0.0, "c": 0.0}, False),
            ("planted null, judged on the search's own blocks", {"a": 0.0, "b": 0.0, "c": 0.0}, True),
            ("one candidate +10%", {"a": 0.0, "b": math.log1p(0.10), "c": 0.0}, False),
            ("one candidate +15%", {"a": 0.0, "b": math.log1p(0.15), "c": 0.0}, False)]
    for label, effects, reuse in rows:
        tunes = [simulate(rng, effects, confirm_blocks=blocks, reuse=reuse) for _ in range(n)]
        named = [t for t in tunes if t.outcome.kind == halving.WINNER]
        right = sum(t.outcome.winner == "b" for t in named)
        gains = [t for t in tunes if t.outcome.winner != DEFAULT]
        which = f" (the right one {right / n:6.1%})" if any(effects.values()) else ""
        print(f"{label:50s} winner named {len(named) / n:6.1%}{which}; mean search figure "
              f"{100 * math.expm1(np.mean([t.search_gain for t in gains])):+.1f}%, mean confirmed "
              f"{100 * math.expm1(np.mean([t.confirmed_gain for t in gains])):+.1f}%")
