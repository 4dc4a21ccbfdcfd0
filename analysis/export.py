"""Machine-readable verdicts: one row per verdict, as JSON (strict: no NaN) or CSV.

`fabricbench compare --json/--csv` and `fabricbench report` (report.json beside report.html)
write the same rows, so a notebook reads what the user read.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from analysis import latency
from analysis.compare import Result

# The CSV's columns, in order; the JSON rows carry these and a few more (see row()).
COLUMNS = ["workload", "point", "metric", "baseline", "other", "ratio", "lo", "hi", "p", "p_corrected", "n", "n_base",
           "design", "correction", "tests", "significant", "control", "outcome", "primary", "conf", "mde"]


def _num(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)  # JSON has no NaN/Infinity


def row(point, c) -> dict[str, Any]:
    """One verdict: ratio = other/baseline in the metric's own units with its interval; speedup
    >1 means `other` is faster/better (inverted for lower-is-better metrics)."""
    return {
        "workload": point.runs[0].workload, "point": point.label, "metric": c.metric,
        "baseline": c.baseline, "other": c.arm,
        "ratio": _num(c.ratio), "lo": _num(c.lo), "hi": _num(c.hi),
        "p": _num(c.p), "p_corrected": _num(c.p_adj), "n": c.n, "n_base": c.n_base,
        "design": c.design, "correction": c.correction, "tests": c.family,
        "significant": c.significant, "control": c.control,
        "speedup": _num(c.speedup), "speedup_lo": _num(c.speedup_lo), "speedup_hi": _num(c.speedup_hi),
        "median": _num(c.median), "median_base": _num(c.median_base), "alpha": c.alpha, "verdict": c.verdict,
        "outcome": c.outcome, "primary": c.primary, "conf": _num(c.conf), "mde": _num(c.mde), "margin": c.margin,
        "p_exact": _num(c.p_exact), "blocks": c.blocks, "looks": c.looks,
        # "difference": ratio, lo, hi and mde are arm - baseline in the metric's units (a count)
        "scale": "difference" if c.raw else "ratio",
    }


def as_dict(result: Result) -> dict[str, Any]:
    return {
        "schema": "fabricbench.verdicts/1",
        "baseline": result.baseline, "correction": result.correction, "alpha": result.alpha,
        "control": result.control_lines(),
        "notes": result.notes(),
        "excluded": [{"label": r.arm, "status": r.status, "source": r.source} for r in result.excluded],
        "verdicts": [row(p, c) for p, c in result.comparisons],
        "refusals": [f.message() for f in result.refusals],
        "latency_arithmetic": latency.of_result(result),
        # points with no counterpart; "split": the identity keys parting one from its sibling of
        # the same fabric and coordinates, as [its value, the sibling's]
        "unmatched": [{"point": p.label, "fabrics": list(p.by_arm), "records": len(p.runs),
                       "split": {k: list(v) for k, v in sorted(result.splits.get(id(p), {}).items())}}
                      for p in result.unmatched],
    }


def to_json(result: Result) -> str:
    return json.dumps(as_dict(result), indent=1, allow_nan=False) + "\n"


def to_csv(result: Result) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for p, c in result.comparisons:
        w.writerow({k: "" if v is None else v for k, v in row(p, c).items()})
    return buf.getvalue()
