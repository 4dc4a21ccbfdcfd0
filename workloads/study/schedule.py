"""The order a study runs its cells in: counterbalanced and interleaved. Pure functions.

A block holds every arm once; trial t of every arm is block t. Within a block the arms
run in the block's order, and each (arm, trial) cell runs the study's workloads in turn:

- `abba`: the arms' order, reversed on every other block (A B | B A | A B | B A ...), so a
  linear drift of the machine or the cluster adds the same total to every arm, and no arm
  always runs first after a pause. Which arm opens the study is a coin drawn from its id and
  seed, so a slow first run (a cold cache) favours neither arm across studies.
- `williams`: for 3 or more arms (and what `abba` becomes there). ABBA's reversal balances a
  linear drift but not carry-over: with arms A B C the middle arm is never first and never
  follows itself, while A and C each follow themselves at every block boundary, so a run
  that gains from a run of its own configuration before it (a warm cache, a qdisc left in
  place, GPU clocks) biases B's verdict while the A/A control, balanced by the same reversal,
  stays blind to it (docs/statistics.md). A Williams square (n rows for
  even n, 2n for odd) has every arm once per row and every ordered pair of different arms
  adjacent equally often; the rows are chained so that no arm follows itself across a block
  boundary, and which arm plays which letter is a seeded shuffle, so the A/A control's
  position is random, not always last. For 2 arms it is ABBA.
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


def williams_rows(n: int) -> list[list[int]]:
    """A Williams square for n treatments: row r is (first row + r) mod n, the first row
    0, 1, n-1, 2, n-2, ...; for odd n the mirrored rows are added (2n rows in all)."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(v + r) % n for v in first] for r in range(n)]
    return rows + [row[::-1] for row in rows] if n % 2 else rows


def _williams_sequence(n: int, blocks: int, seed: int) -> list[list[int]]:
    """The square's rows, cycled, each cycle's rows in a seeded order chained so that a row
    never starts with the arm the previous row ended with (no same-arm neighbours across blocks)."""
    rows, out = williams_rows(n), []
    rng = random.Random(f"williams:{seed}")

    def chain(prev: int | None, todo: list[list[int]]) -> list[list[int]] | None:
        if not todo:
            return []
        for i, r in enumerate(todo):
            if r[0] != prev and (rest := chain(r[-1], todo[:i] + todo[i + 1:])) is not None:
                return [r, *rest]
        return None

    while len(out) < blocks:
        todo = rows[:]
        rng.shuffle(todo)
        out += chain(out[-1][-1] if out else None, todo) or todo  # a chain always exists for n >= 3
    return out[:blocks]


def block_order(arms: Sequence[str], block: int, design: str, seed: int, salt: str = "") -> list[str]:
    if design == "abba" and len(arms) <= 2 or design == "williams" and len(arms) <= 2:
        # which arm starts is a coin drawn from the study (its id as `salt`, and its seed): a study's
        # first run is often slow (a cold cache, clocks ramping), and an arm that always took it
        # would carry that into every verdict (+2.5% at 6 blocks for a first run 15% slower)
        flip = random.Random(f"abba:{salt}:{seed}").random() < 0.5
        return list(arms) if (block + flip) % 2 == 0 else list(reversed(arms))
    if design in ("abba", "williams"):
        letters = list(arms)
        random.Random(f"letters:{seed}").shuffle(letters)  # the control is not always the last letter
        return [letters[i] for i in _williams_sequence(len(arms), block + 1, seed)[block]]
    if design == "permuted":
        order = list(arms)
        random.Random(f"{seed}:{block}").shuffle(order)  # a string seed: stable across Python versions
        return order
    raise ValueError(f"unknown design {design!r}")


def schedule(arms: Sequence[str], blocks: int, design: str, seed: int = 0, salt: str = "") -> list[Cell]:
    cells: list[Cell] = []
    for block in range(blocks):
        for arm in block_order(arms, block, design, seed, salt):
            cells.append(Cell(arm, block, block, len(cells)))
    return cells
