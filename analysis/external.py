"""Results of other tools as records, and fabricbench's collectives in nccl-tests' JSON shape.

Read (so a user can put nccl-tests' own numbers beside fabricbench's on one busbw chart):
- nccl-tests `-J FILE` reports (src/util.cu of NVIDIA/nccl-tests: one JSON object with `args`
  (argv; argv[0] names the op: all_reduce_perf), `config`, `results`: a list of {size, count,
  type, redop, root (a "%6i" string), out_of_place/in_place: {time or cpu_time, alg_bw, bus_bw,
  nwrong}}, `out_of_bounds`, `average_bus_bandwidth`), parsed by the same reader the external
  run uses (workloads/collectives/nccltests.parse_json);
- rccl-tests `-Z json -x FILE` output (src/common.cu of ROCm/rccl-tests, Reporter::addResult):
  one object per line and placement, {"name", "gpus" (or nodes/ranks/...), "size", "type",
  "redop", "inPlace", "time", "algBw", "busBw", "wrong"}; string values may be unquoted there,
  so each line is read key by key rather than with json.loads.

An external record has no fabricbench identity, so the guard cannot vouch for a comparison:
it is drawn for reference (grey) and never enters a verdict.

Write: `nccl_tests_json(record)` turns a fabricbench collectives record into one `-J`-shaped
document per op, so tools that read nccl-tests' JSON read ours.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

from analysis.load import Run, run_from_record
from workloads.collectives.nccltests import op_from_binary, parse_json
from workloads.core.errors import UsageError

_PAIR = re.compile(r'"(\w+)"\s*:\s*("(?:[^"\\]|\\.)*"|[^,}]+)')


def _record(rows: list[dict], tool: str, path: Path, avg: float | None = None) -> dict[str, Any]:
    label = f"{tool}: {path.name}"
    return {"schema": "fabricbench.record/1", "workload": "collectives", "status": "ok", "_path": str(path),
            "fabric": {"name": label}, "external": {"tool": tool, "path": str(path)}, "rows": rows,
            "metrics": {} if avg is None else {"avg_busbw(GB/s)": avg}}


def _rccl_rows(text: str) -> list[dict]:
    cells: dict[tuple, dict[str, Any]] = {}
    for line in text.splitlines():
        kv = {k: v.strip().strip('"') for k, v in _PAIR.findall(line)}
        if "busBw" not in kv or "size" not in kv:
            continue
        key = (kv.get("name", "?"), int(kv["size"]), kv.get("type", "?"), kv.get("redop", "?"))
        row = cells.setdefault(key, {"op": op_from_binary(key[0]), "size": key[1], "count": None, "type": key[2],
                                     "redop": key[3], "root": -1, "out_of_place": None, "in_place": None})
        wrong = kv.get("wrong", "N/A")
        row["in_place" if kv.get("inPlace", "0") == "1" else "out_of_place"] = {
            "time_us": float(kv["time"]), "algbw": float(kv["algBw"]), "busbw": float(kv["busBw"]),
            "wrong": None if not wrong.lstrip("-").isdigit() else int(wrong)}
    return list(cells.values())


@contextlib.contextmanager
def _malformed(p: Path, what: str):
    """A field that is missing or not a number ("bus_bw": "fast", a result without "size")
    names the file and the field, instead of a traceback from deep in the parser."""
    try:
        yield
    except KeyError as e:
        raise UsageError(f"--external {p}: a result of this {what} has no {e.args[0]!r} field; pass the "
                         "file as the tool wrote it") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise UsageError(f"--external {p}: a value of this {what} is not what the tool writes ({e}); pass the "
                         "file as the tool wrote it") from None


def read(path: str | Path) -> dict[str, Any]:
    """One external results file as a record; UsageError naming the file when it is neither format."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UsageError(f"--external {p}: cannot read ({e.strerror}); pass an nccl-tests -J or rccl-tests -Z json file") from None
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, Mapping) and isinstance(obj.get("results"), list):
        argv = obj.get("args") or ["all_reduce_perf"]
        with _malformed(p, "nccl-tests -J report"):
            parsed = parse_json(dict(obj), op_from_binary(str(argv[0])))
        return _record(parsed["rows"], "nccl-tests", p, parsed["avg_busbw"])
    with _malformed(p, "rccl-tests -Z json line"):
        rows = _rccl_rows(text)
    if not rows:
        raise UsageError(f"--external {p}: neither an nccl-tests -J report (a JSON object with 'results') nor "
                         f"rccl-tests -Z json lines (with 'busBw'); pass one of those files")
    return _record(rows, "rccl-tests", p)


def load(paths: Iterable[str | Path]) -> list[Run]:
    return [run_from_record(read(p)) for p in paths]


def _cell(c: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not c:
        return None
    return {"time": c.get("time_us"), "alg_bw": c.get("algbw"), "bus_bw": c.get("busbw"), "nwrong": c.get("wrong")}


def nccl_tests_json(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{op: document} in nccl-tests' -J shape (JSON_FILE_VERSION 1), one per op of the record."""
    by_op: dict[str, list[Mapping]] = defaultdict(list)
    for row in record.get("rows") or []:
        if isinstance(row, Mapping) and row.get("op") and row.get("size"):
            by_op[str(row["op"])].append(row)
    out = {}
    for op, rows in by_op.items():
        bws = [c["busbw"] for r in rows for c in (r.get("out_of_place"), r.get("in_place")) if c and c.get("busbw") is not None]
        wrong = sum(1 for r in rows for c in (r.get("out_of_place"), r.get("in_place")) if c and c.get("wrong"))
        out[op] = {
            "version": 1, "args": [f"fabricbench:{op}_perf"], "nccl_version": None,
            "config": {"fabricbench_run_id": record.get("run_id"), "fabric": (record.get("fabric") or {}).get("name")},
            "results": [{"size": int(r["size"]), "count": r.get("count"), "type": r.get("type"), "redop": r.get("redop"),
                         "root": f"{int(r.get('root', -1)):6d}", "out_of_place": _cell(r.get("out_of_place")),
                         "in_place": _cell(r.get("in_place")),
                         "actual_iterations": (record.get("collectives") or {}).get("iters"), "experiment_name": ""}
                        for r in rows],
            "out_of_bounds": {"count": wrong, "okay": "true" if wrong == 0 else "false"},
            "average_bus_bandwidth": {"bandwidth": sum(bws) / len(bws) if bws else "nan", "okay": "unchecked"},
            "errors": [],
        }
    return out
