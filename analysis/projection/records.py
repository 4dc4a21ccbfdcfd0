"""Reading collectives records: the fabric, code and block of each, their timed cells as Points,
and which records one fit may use."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from analysis.projection.forms import ALGORITHMS
from workloads.core.errors import UsageError


@dataclass(frozen=True)
class Point:
    op: str
    p: int            # ranks in the communicator
    size: int         # bytes (the size column)
    block: str        # what a bootstrap resamples: "<scale>/<study id>:<block>" or "<scale>/<run>:<trial>"
    time_s: float     # one call, the block timing (nccl-tests' time column), out-of-place when measured


def fabric_of(rec: dict[str, Any]) -> str:
    """The fabric a record ran on: its profile's name, and for an emulated one what the emulator
    set (rate, delay, burst, ...; the node count is the scale, not the fabric): emu-100m asked for
    10mbit is another fabric than emu-100m as shipped."""
    name = str((rec.get("fabric") or {}).get("name") or ((rec.get("config") or {}).get("fabric") or {}).get("name"))
    emu = {k: v for k, v in ((((rec.get("config") or {}).get("fabric") or {}).get("emulate")) or {}).items()
           if k != "nodes" and v is not None and (k, v) not in (("mtu", 1500), ("qdisc", "tbf"))}
    return name + (" (" + ", ".join(f"{k}={v}" for k, v in sorted(emu.items())) + ")" if emu else "")


def code_of(rec: dict[str, Any]) -> tuple[str | None, str | None]:
    git = (rec.get("fingerprint") or {}).get("git") or {}
    return git.get("commit"), git.get("dirty_hash")


def block_of(rec: dict[str, Any]) -> str:
    st = rec.get("study") or {}
    if st.get("block") is not None:
        return f"{st.get('id') or st.get('name')}:{st['block']}"
    return f"{rec.get('run_id')}:{(rec.get('config') or {}).get('trial', 0)}"


def points(rec: dict[str, Any], ops: Iterable[str] | None = None) -> list[Point]:
    """The record's timed cells as Points: one per op and size, the out-of-place time when
    measured, else the in-place one (torch has only in-place all_reduce)."""
    want = set(ops) if ops else set(ALGORITHMS)
    out = []
    for row in rec.get("rows") or []:
        op = row.get("op")
        if op not in want or not row.get("size"):
            continue
        cell = next((row[k] for k in ("out_of_place", "in_place") if row.get(k) and row[k].get("time_us")), None)
        if cell is None:
            continue
        p = int(row.get("group_size") or (rec.get("world") or {}).get("world_size"))
        if p < 2:
            continue
        out.append(Point(op, p, int(row["size"]), f"{p}/{block_of(rec)}", cell["time_us"] / 1e6))
    return out


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def check_times(path: Path, rec: dict[str, Any]) -> None:
    """A UsageError naming the record file, the row and the value of the first time, size or rank
    count a fit cannot use: not a number, not finite, zero or negative. A cell that was not
    measured is null (or absent), never 0."""
    rows = rec.get("rows")
    if rows is not None and not isinstance(rows, list):
        raise UsageError(f"{path}: rows is {type(rows).__name__}, not a list of cells; rerun the sweep or remove the file")
    for i, row in enumerate(rows or []):
        if not isinstance(row, dict) or row.get("op") not in ALGORITHMS:
            continue
        where = f"{path}: rows[{i}] ({row.get('op')}"
        for key in ("size", "group_size"):
            if row.get(key) is not None and not (_positive(row[key]) and float(row[key]).is_integer()):
                raise UsageError(f"{where}) {key} is {row[key]!r}, not a whole number above 0; rerun the sweep or "
                                 "remove the file")
        for side in ("out_of_place", "in_place"):
            cell = row.get(side)
            if cell is None:
                continue
            t = cell.get("time_us") if isinstance(cell, dict) else cell
            if t is not None and not _positive(t):
                raise UsageError(f"{where} {row.get('size')} B) {side}.time_us is {t!r}: a time must be a finite "
                                 "number above 0 (an unmeasured cell is null); rerun the sweep or remove the file")


def _parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S.%f%z"):
        try:
            return datetime.strptime(s, fmt)
        except ValueError:
            pass
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return None


def select(records: list[tuple[Path, dict[str, Any]]], fabric: str | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """The ok collectives records one fit may use, or a UsageError naming why none may: two
    fabrics without --fabric, records of different code, one scale only."""
    recs = [(p, r) for p, r in records if r.get("workload") == "collectives" and r.get("status") == "ok"]
    if not recs:
        raise UsageError("no ok collectives records found; run launch/collectives.py at two or more world sizes "
                         "(emulated: launch/emulate.py --nodes 2, then --nodes 4) and fit their results folder")
    fabrics = sorted({fabric_of(r) for _, r in recs})
    if fabric is not None:
        recs = [(p, r) for p, r in recs if fabric in (fabric_of(r), fabric_of(r).split(" (")[0])]
        if not recs:
            raise UsageError(f"no collectives records of fabric {fabric!r}; these records are of {'; '.join(fabrics)}")
        fabrics = sorted({fabric_of(r) for _, r in recs})
    if len(fabrics) > 1:
        raise UsageError(f"these records are of {len(fabrics)} fabrics ({'; '.join(fabrics)}); one calibration is one "
                         "fabric: pass --fabric NAME (and fit each fabric on its own; an emulated fabric's rate and "
                         "delay are part of it: fit each setting's folder apart)")
    for path, r in recs:
        check_times(path, r)
    backends = sorted({str((r.get("fabric") or {}).get("backend") or "unnamed").lower() for _, r in recs})
    if len(backends) > 1:
        raise UsageError(f"these records of {fabrics[0]} ran on {len(backends)} backends ({', '.join(backends)}); a "
                         "calibration is of one: fit each backend's records apart (one results folder each)")
    nccls = sorted({str((r.get("fingerprint") or {}).get("nccl")) for _, r in recs
                    if (r.get("fingerprint") or {}).get("nccl")})
    if len(nccls) > 1:
        raise UsageError(f"these records of {fabrics[0]} ran NCCL {', '.join(nccls)}; a calibration is of one NCCL: "
                         "fit each version's records apart")
    codes = sorted({code_of(r) for _, r in recs}, key=str)
    if len(codes) > 1:
        shown = "; ".join(f"commit {c[0] and c[0][:12]}{' + edits ' + c[1][:8] if c[1] else ''}" for c in codes[:4])
        raise UsageError(f"these records were made by {len(codes)} versions of the code ({shown}); a calibration is "
                         "fitted on one: rerun the sweeps on one commit, or fit each folder apart")
    scales = sorted({pt.p for _, r in recs for pt in points(r)})
    if len(scales) < 2:
        raise UsageError(f"collectives records at one scale only ({', '.join(map(str, scales)) or 'none'} ranks); a fit "
                         "needs two or more (its model-form error is measured by predicting one scale from the "
                         "others): run the same sweep at another world size, e.g. launch/emulate.py --nodes 4")
    return recs
