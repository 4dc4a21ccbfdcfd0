"""results.csv: every record's metrics, one flat row per record, for pandas users.

`pd.read_csv("report/results.csv")` gives one row per record: where it lies (relative to the
input folder), its arm, fabric, workload, status, model, load point, sweep coordinates and
every numeric metric (units in the column names, as in the record). Parquet is not written:
pyarrow is not a dependency, and a CSV of a few hundred rows needs none.
"""

from __future__ import annotations

import csv
import io

from analysis.load import Table

FIXED = ["record", "arm", "fabric", "workload", "status", "run_id", "model", "parallel", "point"]


def to_csv(table: Table, names: dict[int, str] | None = None) -> str:
    names = names or {}
    coords = sorted({k for r in table for k in r.coords})
    metrics = sorted({k for r in table for k in r.metrics})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*FIXED, *coords, *metrics])
    for r in table:
        fixed = [names.get(id(r), r.source), r.fabric, r.fabric_name, r.workload, r.status, r.run_id, r.model, r.parallel,
                 r.point]
        w.writerow([("" if v is None else v) for v in fixed] + [_g(r.coords.get(k)) for k in coords]
                   + [_g(r.metrics.get(k)) for k in metrics])
    return buf.getvalue()


def _g(v: float | None) -> str:
    return "" if v is None else repr(float(v))
