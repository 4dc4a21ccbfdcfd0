"""How long a verdict took, from the records alone: what the runs measured against what they
cost, and the run time per decided primary verdict.

A record's `timeline` (workloads/core/timeline.py) gives seconds since its run was launched: the
measured window (`window` to `window_end`) and the moment the record was closed (`record`). A
run's cost is its latest record's `record` mark (a sweep's points share one run and one clock);
what it measured is the sum of its points' windows. Records without a timeline (a raw torchrun,
older records) fall back to the NIC counters' window for what was measured and add no cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


def measured_s(rec: dict[str, Any]) -> float | None:
    """The seconds a record measured: its timeline's window, else its NIC counters' window."""
    tl = rec.get("timeline") or {}
    if isinstance(tl.get("window"), (int, float)) and isinstance(tl.get("window_end"), (int, float)):
        return max(tl["window_end"] - tl["window"], 0.0)
    w = (rec.get("nic") or {}).get("window_s")
    return float(w) if isinstance(w, (int, float)) else None


@dataclass(frozen=True)
class Clock:
    runs: int            # runs with a launch clock
    measured_s: float    # their points' measured windows, summed
    cost_s: float        # launch to last record, summed over those runs
    decided: int         # primary verdicts decided (a difference called, or equivalence)
    primaries: int

    @property
    def duty(self) -> float:
        return self.measured_s / self.cost_s if self.cost_s > 0 else 0.0

    def line(self) -> str:
        head = (f"{self.runs} run(s): {self.measured_s:.0f} s measured of {self.cost_s:.0f} s from launch to record "
                f"(duty cycle {100 * self.duty:.0f}%)")
        if not self.primaries:
            return head
        if not self.decided:
            return f"{head}; none of {self.primaries} primary verdict(s) decided yet"
        return (f"{head}; {self.decided} of {self.primaries} primary verdict(s) decided, "
                f"{self.cost_s / self.decided:.0f} s of run time each")


def clock(records: Iterable[dict[str, Any]], decided: int = 0, primaries: int = 0) -> Clock | None:
    """The clock of the ok records that carry a launch clock; None when none does."""
    cost: dict[str, float] = {}
    measured = 0.0
    for rec in records:
        tl = rec.get("timeline") or {}
        if rec.get("status") != "ok" or not isinstance(tl.get("record"), (int, float)):
            continue
        run = str(rec.get("run_id") or id(rec))
        cost[run] = max(cost.get(run, 0.0), float(tl["record"]))
        measured += measured_s(rec) or 0.0
    if not cost:
        return None
    return Clock(len(cost), measured, sum(cost.values()), decided, primaries)
