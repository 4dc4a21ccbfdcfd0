"""`fabricbench compare`'s verdicts as text: the refusals before judging, the lines it prints, and
the refusal when nothing was judged. `fabricbench compare`, `report` and a study's end
(workloads/study/run.py, in its own process) all say their verdicts through these, so a study's
compare.txt is what `fabricbench compare` on its folder prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from analysis.compare import Result, compare_table
from analysis.load import Table
from workloads.core.errors import UsageError


def judge(table: Table, baseline: str | None, allow: Iterable[str] = (), metrics: Iterable[str] | None = None,
          alpha: float | None = None, correction: str = "holm", where: str = "") -> Result:
    """compare_table, after the input is checked in the words of compare's options (`where`:
    what was read, for the message when it held no record)."""
    if not table:
        raise UsageError(f"no result records found in {where}")
    if baseline and baseline not in table.arms:
        raise UsageError(f"--baseline {baseline}: no such arm or fabric in the records; they hold {', '.join(table.arms)}")
    if alpha is not None and not 0 < alpha < 1:
        raise UsageError(f"--alpha {alpha:g}: write a level between 0 and 1, e.g. 0.05")
    return compare_table(table, baseline, allow, metrics, alpha, correction)


def lines(result: Result, verbose: bool = False, dirs: Sequence[str] = ()) -> list[str]:
    """What compare prints: whether any verdict can be trusted first, the verdicts, the job
    completion times, the headlines (what a study's console ends on), the near misses."""
    out = result.control_lines() + result.notes()
    if (excluded := result.excluded_summary()) is not None:
        out.append(excluded)
    out += [f"{p.label} [{c.metric}]: {c.verdict}" for p, c in result.comparisons]
    from analysis import latency, topology

    out += latency.of_result(result)  # arms that differ in delay: what each added time is made of

    # emulate --jobs writes its summaries beside the run folders, under the folders given here
    found = {s["_path"]: s for d in dirs for s in topology.jobs_summaries(Path(d))}
    out += topology.jct_verdicts(list(found.values()), result.baseline)
    from analysis.summary import headlines

    out += [f"headline: {workload}, {claim} {detail}" for workload, claim, detail in headlines(result)]
    out += [f"refused: {r.message()}" for r in result.refusals]  # near misses only: the comparisons most likely meant
    if (summary := result.unmatched_summary(verbose)) is not None:
        out.append(summary)
        if verbose:
            out += [f"  {line}" for line in result.unmatched_lines()]
    return out


def unjudged(table: Table, result: Result) -> str | None:
    """Why nothing was judged (compare then exits 2), or None when something was."""
    if result.comparisons:
        return None
    return "no two fabrics share a point: " + (
        result.refusals[0].message() if result.refusals else
        f"the records hold only fabric(s) {', '.join(table.arms)}" if len(table.arms) < 2 else
        f"no point that {result.baseline} reached was run under another fabric; pass --verbose to list the points, "
        "or --baseline another fabric")
