"""Checking a calibration against records it did not see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.projection.fit import _cells
from analysis.projection.project import project
from analysis.projection.records import Point, _parse_time, check_times, code_of, fabric_of, points
from workloads.core.errors import UsageError


def left_out(cal: dict[str, Any], records: list[tuple[Path, dict[str, Any]]]) -> list[tuple[Path, str]]:
    """The records a check does not use, each with why: not a collectives record, not ok, one the
    calibration was fitted on (by record id; by path for a calibration that kept none), or with
    no timed cell of a collective the calibration has."""
    ids = set(cal.get("record_ids") or ())
    fitted = set(cal.get("records") or ())
    out = []
    for path, r in records:
        if r.get("workload") != "collectives":
            out.append((path, f"a {r.get('workload')} record, not collectives"))
        elif r.get("status") != "ok":
            out.append((path, f"status {r.get('status')}"))
        elif (r.get("record_id") in ids) if ids else (str(path) in fitted):
            out.append((path, "the calibration was fitted on it"))
        elif not points(r, cal["ops"]):
            out.append((path, f"no timed cell of {', '.join(cal['ops'])}"))
    return out


def check_against(cal: dict[str, Any], records: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per measured cell of `records` (same fabric, same code, not fitted on): the projection and
    whether the measurement fell inside its interval. Refused with one line when the records are
    of another fabric or other code than the calibration, or newer code than it, or are all ones
    it was fitted on (left_out names every record set aside and why)."""
    left = left_out(cal, records)
    skip = {p for p, _ in left}
    if any(why == "the calibration was fitted on it" for _, why in left) and not [p for p, _ in records if p not in skip]:
        raise UsageError(f"every record given ({len(records)}) is one the calibration was fitted on: a check on them "
                         "says nothing about other scales; check against records it did not see (another run, e.g. at "
                         "twice the largest fitted scale)")
    recs = [(p, r) for p, r in records if p not in skip]
    for path, r in recs:
        check_times(path, r)
    if not recs:
        raise UsageError("no ok collectives records to check the calibration against")
    other = sorted({fabric_of(r) for _, r in recs} - {cal["fabric"]})
    if other:
        raise UsageError(f"these records are of {', '.join(other)}, the calibration of {cal['fabric']}; check a "
                         "calibration against its own fabric's records")
    made = _parse_time(cal.get("created"))
    for path, r in recs:
        commit, dirty = code_of(r)
        if (commit, dirty) != (cal["code"]["commit"], cal["code"]["dirty_hash"]):
            when = _parse_time(r.get("created"))
            older = " is older than these records and" if made and when and when > made else ""
            raise UsageError(f"the calibration{older} was fitted on other code (commit {str(cal['code']['commit'])[:12]}) "
                             f"than {path.name} (commit {str(commit)[:12]}{', with edits' if dirty else ''}); refit "
                             "with `fabricbench model fit` on records of the same code")
    if "nccl" in cal:
        import analysis.projection.hierarchy as hierarchy

        for path, r in recs:
            theirs = (r.get("fingerprint") or {}).get("nccl")
            if theirs and str(theirs) != str(cal["nccl"]["nccl"]):
                # NCCL's algorithm choice and constants are per release: another NCCL's cells test another model
                raise UsageError(f"the calibration was fitted on NCCL {cal['nccl']['nccl']} records, {path.name} ran NCCL "
                                 f"{theirs}: check against records of the same NCCL install (or fit one on these)")
        return hierarchy.check_rows(cal, [r for _, r in recs])
    out = []
    for op, ps in _group_op([pt for _, r in recs for pt in points(r, cal["ops"])]).items():
        for (p, s), t in sorted(_cells(ps).items()):
            pr = project(cal, op, p, s)
            out.append({"op": op, "p": p, "size": s, "measured_s": t, "predicted_s": pr.time_s, "low_s": pr.low_s,
                        "high_s": pr.high_s, "inside": pr.low_s <= t <= pr.high_s, "label": pr.label,
                        "inside_with_form": pr.with_form[0] <= t <= pr.with_form[1],
                        "abs_error": abs(t / pr.time_s - 1)})
    return out


def _group_op(pts: list[Point]) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for pt in pts:
        out.setdefault(pt.op, []).append(pt)
    return out
