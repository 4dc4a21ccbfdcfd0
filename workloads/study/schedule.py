"""The order a study runs its cells in: counterbalanced and interleaved. Pure functions.

A block holds every arm once; trial t of every arm is block t. Within a block the arms
run in the block's order, and each (arm, trial) cell runs the study's workloads in turn:

- `abba`: the arms' order, reversed on every other block (A B | B A | A B | B A ...), so a
  linear drift of the machine or the cluster adds the same total to every arm, and no arm
  always runs first after a pause.
- `permuted`: a random order per block, seeded (`seed`), so a drift with a period of two
  blocks cannot line up with the design; the same seed gives the same schedule.

Every cell carries its block and its position in the whole schedule, recorded in its
records so analysis can pair or block by them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Cell:
    arm: str
    trial: int
    block: int
    position: int      # 0-based index of this (arm, trial) in the whole schedule


def block_order(arms: Sequence[str], block: int, design: str, seed: int) -> list[str]:
    if design == "abba":
        return list(arms) if block % 2 == 0 else list(reversed(arms))
    if design == "permuted":
        order = list(arms)
        random.Random(f"{seed}:{block}").shuffle(order)  # a string seed: stable across Python versions
        return order
    raise ValueError(f"unknown design {design!r}")


def schedule(arms: Sequence[str], trials: int, design: str, seed: int = 0) -> list[Cell]:
    cells: list[Cell] = []
    for block in range(trials):
        for arm in block_order(arms, block, design, seed):
            cells.append(Cell(arm, block, block, len(cells)))
    return cells
