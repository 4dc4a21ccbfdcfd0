"""NCCL's own cost model, read from its TUNING log lines, as a check on a calibration.

NCCL prices every (collective, algorithm, protocol) as `time = latency + bytes / bandwidth` at
communicator init (src/graph/tuning.cc, ncclTopoTuneModel; ncclTopoGetAlgoTime), and rank 0 logs
the table when NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING (or ALL) are set:

    NCCL 2.19+ (tuning.cc, blocks of three algorithms; 2.30.x prints all seven in three blocks):
      ... NCCL INFO   Algorithm   |                     Tree                    ...  |
      ... NCCL INFO   Protocol    |             LL |          LL128 |         Simple | ...
      ... NCCL INFO  Max NThreads |            512 |            640 |            512 | ...
      ... NCCL INFO     Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 | ...
    NCCL 2.7-2.18 (one line of every algorithm/protocol):
      ... NCCL INFO Latency/AlgBw |    Tree/    LL |    Tree/ LL128 | ...
      ... NCCL INFO  Max NThreads |            512 | ...
      ... NCCL INFO     AllReduce |    10.4/   4.3 |  ...

Each cell is `%8.1f/%6.1f`: the latency in microseconds (NCCL's base latency of the algorithm
plus a per-step hardware latency x its steps) and the *algorithm* bandwidth in GB/s (the bus
bandwidth x nRanks / nsteps for a ring). For a ring that is the fabricbench model's form:
nsteps = L(p), busbw = algbw x G(p), so NCCL's latency / L(p) is a per-step alpha and algbw x G(p)
a bus bandwidth B, comparable with a calibration's at the same rank count. (NCCL 2.30 multiplies
a multi-node ring/Simple all_reduce's latency by 1.4 on sm80+ (1.9 before) once the buffer passes
64 B per channel and rank, the "plateau effect of ring": ncclTopoGetAlgoTime; not in the table.)

The table belongs to the communicator whose init it precedes: its rank count is taken from the
next `... nranks N ... Init COMPLETE` line of the same log. Nothing here runs NCCL.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from workloads.core.errors import UsageError

# NCCL's names (src/init.cc ncclFuncStr) for the ops fabricbench calibrates
FUNC_OF = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter"}
PROTOCOLS = ("LL", "LL128", "Simple")          # ncclProtoStr, in table order
PLATEAU = 1.4                                   # ring/Simple all_reduce latency factor, multi-node, sm80+

_INFO = re.compile(r"NCCL INFO (?P<body>.*)$")
_CELL = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*/\s*(-?\d+(?:\.\d+)?)\s*$")
_NRANKS = re.compile(r"\bnranks (?P<n>\d+)\b.*Init COMPLETE")
_NNODES = re.compile(r"\bnRanks (?P<r>\d+) nNodes (?P<n>\d+) localRanks (?P<l>\d+)")    # init.cc, 2.23.4 and 2.30.7
_VERSION = re.compile(r"NCCL version (?P<v>\S+)")
_PER_CALL = re.compile(r"^\w+: \d+ Bytes -> Algo ")    # enqueue.cc: one line per collective call


def _cols(body: str) -> list[str]:
    return [c.strip() for c in body.split("|")[1:-1]]


def parse_tuning(text: str) -> list[dict[str, Any]]:
    """Every tuning table of one NCCL log: [{"nranks": N or None, "cells": {func: {"Ring/Simple":
    (latency_us, algbw_GBps), ...}}}], in log order."""
    tables: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    columns: list[str] = []
    algos: list[str] = []
    version, layout, per_call = None, None, False
    for line in text.splitlines():
        m = _INFO.search(line)
        if not m:
            continue
        body = m.group("body")
        head = body.split("|")[0].strip()
        if head == "Latency/AlgBw":                    # 2.7-2.18: "Tree/    LL" per column
            cur = {"nranks": None, "cells": {}}
            tables.append(cur)
            columns = ["/".join(x.strip() for x in c.split("/")) for c in _cols(body)]
        elif head == "Algorithm":                      # 2.19+: a block of up to three algorithms
            if cur is None or cur["nranks"] is not None or any(a in cur.setdefault("_seen", set()) for a in _cols(body)):
                cur = {"nranks": None, "cells": {}, "_seen": set()}
                tables.append(cur)
            algos = [c for c in _cols(body) if c]
            cur["_seen"].update(algos)
            columns = [f"{a}/{p}" for a in algos for p in PROTOCOLS]
        elif head in ("Protocol", "Max NThreads"):
            continue
        elif cur is not None and columns and head and "|" in body:
            vals = [_CELL.match(c) for c in _cols(body)]
            if vals and all(vals):
                row = cur["cells"].setdefault(head, {})
                for name, v in zip(columns, vals):
                    row[name] = (float(v.group(1)), float(v.group(2)))
        v = _VERSION.search(body)
        if v:
            version = v.group("v")
        per_call = per_call or bool(_PER_CALL.search(body))
        nn = _NNODES.search(body)
        if nn:
            layout = (int(nn.group("n")), int(nn.group("l")))
        n = _NRANKS.search(body)
        if n:
            for t in tables:
                if t["nranks"] is None:
                    t["nranks"] = int(n.group("n"))
                    t["nodes"], t["local_ranks"] = layout if layout and layout[0] * layout[1] == t["nranks"] else (None, None)
                    t["version"] = version
    for t in tables:
        t.pop("_seen", None)
        t["per_call_lines"] = per_call
    return tables


def read(path: str | Path) -> dict[str, Any]:
    """The tuning table of an NCCL log file (or the first log in a folder that has one), with the
    file it came from; a UsageError naming the fix when none has one."""
    path = Path(path)
    files = sorted(path.glob("*.log")) + sorted(path.glob("*.txt")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise UsageError(f"--nccl-log {path}: no NCCL log there; give a file NCCL_DEBUG_FILE wrote, or its folder")
    for f in files:
        tables = [t for t in parse_tuning(f.read_text(errors="replace")) if t["cells"]]
        if tables:
            return tables[-1] | {"file": str(f)}
    raise UsageError(f"--nccl-log {path}: no tuning table in it; rerun with NCCL_DEBUG=INFO "
                     "NCCL_DEBUG_SUBSYS=INIT,TUNING (rank 0's log holds it)")


def ring_terms(table: dict[str, Any], op: str) -> dict[str, Any] | None:
    """NCCL's ring/Simple entry for `op` as the calibration's terms at the table's rank count:
    alpha per step (latency / L(p)) and the bus bandwidth (algbw x G(p)); None when the table has
    no rank count or no usable ring/Simple entry for op."""
    from analysis.projection import terms

    func, p = FUNC_OF.get(op), table.get("nranks")
    cell = (table["cells"].get(func) or {}).get("Ring/Simple") if func else None
    if not cell or not p or p < 2 or cell[1] <= 0:
        return None
    L, G = terms(op, p)
    lat_us, algbw = cell
    return {"p": p, "latency_us": lat_us, "algbw_GBps": algbw, "alpha_s": lat_us * 1e-6 / L,
            "bandwidth_GBps": algbw * G}


def nccl_time(table: dict[str, Any], op: str, size: int, multi_node: bool = True) -> float | None:
    """NCCL's own predicted seconds for one call of `size` bytes: the fastest enabled (bandwidth >
    0) algorithm/protocol of its table, as ncclTopoGetAlgoTime prices it (one operation; tree's
    per-size correction factors left out, so tree is priced at its table bandwidth)."""
    func = FUNC_OF.get(op)
    row = table["cells"].get(func) if func else None
    if not row:
        return None
    best = math.inf
    p = table.get("nranks") or 1
    for name, (lat_us, bw) in row.items():
        if bw <= 0:
            continue
        if name == "Ring/Simple" and func == "AllReduce" and multi_node and size / p >= 64:
            lat_us *= PLATEAU
        best = min(best, lat_us * 1e-6 + size / (bw * 1e9))
    return best if best < math.inf else None


def check(cal: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """NCCL's own model beside the calibration, per op: its ring/Simple alpha and bus bandwidth
    against the fitted ones, and its predicted time against each measured cell at its rank count
    (when the calibration measured that scale)."""
    out: dict[str, Any] = {"file": table.get("file"), "nranks": table.get("nranks"), "ops": {}}
    for op, c in cal["ops"].items():
        ring = ring_terms(table, op)
        if ring is None:
            continue
        cells = [x for x in c["cells"] if x["p"] == ring["p"]]
        errs = []
        for x in cells:
            t = nccl_time(table, op, x["size"])
            if t:
                errs.append(t / x["time_s"] - 1)
        out["ops"][op] = ring | {
            "alpha_ratio": ring["alpha_s"] / c["alpha_s"] if c["alpha_s"] > 0 else None,
            "bandwidth_ratio": ring["bandwidth_GBps"] / c["bandwidth_GBps"] if c.get("bandwidth_GBps") else None,
            "cells": len(errs),
            "median_error_vs_measured": sorted(errs)[len(errs) // 2] if errs else None,
        }
    return out


def check_lines(chk: dict[str, Any]) -> list[str]:
    out = [f"  NCCL's own model ({chk['file']}, {chk['nranks']} ranks, ring/Simple of its tuning table):"]
    if not chk["ops"]:
        out.append("    no collective of the calibration is in that table with a rank count")
    for op, o in chk["ops"].items():
        line = (f"    {op}: latency {o['latency_us']:.1f} us = {o['alpha_s'] * 1e6:.2f} us per step, bus bandwidth "
                f"{o['bandwidth_GBps']:.4g} GB/s")
        if o["alpha_ratio"] is not None:
            line += f"; NCCL's alpha is {o['alpha_ratio']:.3g}x the fitted one"
        if o["bandwidth_ratio"] is not None:
            line += f", its B {o['bandwidth_ratio']:.3g}x"
        if o["median_error_vs_measured"] is not None:
            line += (f"; at {o['p']} ranks NCCL's fastest algorithm predicts {100 * o['median_error_vs_measured']:+.1f}% "
                     f"(median over {o['cells']} measured sizes)")
        out.append(line)
    return out


AGREE = 0.10        # within 10% at every size the two models agree; beyond it the line says where


def check_nccl(cal: dict[str, Any], table: dict[str, Any], sizes: list[int] | None = None) -> dict[str, Any]:
    """An NCCL calibration's projection beside NCCL's own table at the table's communicator: per
    op and size both models' times and algorithms (NCCL's priced from its table as
    ncclTopoGetAlgoTime does, tree correction and ring plateau included). A calibration of a
    fabric NCCL describes exactly agrees at every size. A table of another NCCL release, or
    without its node layout, is refused."""
    from analysis import nccl_cost as nc
    from analysis.projection import hierarchy as hi

    h = cal["nccl"]
    if nc.version_of(table.get("version")) != h["version"]:
        raise UsageError(f"--nccl-log {table.get('file')}: NCCL {table.get('version')} wrote it, the records ran NCCL "
                         f"{h['nccl']}: give a log of the same NCCL install")
    nodes, gpn = table.get("nodes"), table.get("local_ranks")
    if not nodes or not gpn:
        raise UsageError(f"--nccl-log {table.get('file')}: no 'nRanks N nNodes N localRanks N' line for its table; "
                         "rerun with NCCL_DEBUG_SUBSYS=INIT,TUNING")
    topo = hi.base_topology(nodes, gpn, h["channels"], h["intra"], h["nvls"], h["compcap"], h["cpu"])
    out: dict[str, Any] = {"file": table.get("file"), "nranks": table.get("nranks"), "nodes": nodes, "gpus_per_node": gpn,
                           "version": table.get("version"), "ops": {}}
    for op in hi.NCCL_OPS:
        func = FUNC_OF[op]
        if func not in table["cells"]:
            continue
        rows = []
        for s in sizes or [1 << k for k in range(10, 29, 2)]:
            theirs = {k: v for k in table["cells"][func] if (v := nc.algo_time(table["cells"], topo, func, k, s, h["version"]))}
            if not theirs:
                continue
            best = min(theirs, key=theirs.__getitem__)
            ours = hi.predict(op, s, nodes, gpn, cal)
            rows.append({"size": s, "nccl_s": theirs[best] * 1e-6, "nccl_algo": best, "ours_s": ours["time_s"],
                         "ours_algo": f"{ours['algo']}/{ours['proto']}", "ratio": ours["time_s"] / (theirs[best] * 1e-6)})
        if rows:
            worst = max(rows, key=lambda r: abs(math.log(r["ratio"])))
            out["ops"][op] = {"rows": rows, "worst": worst, "agree": abs(worst["ratio"] - 1) <= AGREE,
                              "same_algo": sum(r["nccl_algo"] == r["ours_algo"] for r in rows)}
    return out


def check_nccl_lines(chk: dict[str, Any]) -> list[str]:
    out = [f"  NCCL's own table ({chk['file']}, NCCL {chk['version']}, {chk['nodes']} x {chk['gpus_per_node']}) beside "
           "this calibration:"]
    for op, o in chk["ops"].items():
        w, n = o["worst"], len(o["rows"])
        verdict = (f"agrees within {100 * AGREE:.0f}% at all {n} sizes" if o["agree"] else
                   f"differs: at {w['size']} B NCCL's table gives {w['nccl_s'] * 1e6:.1f} us ({w['nccl_algo']}), "
                   f"the calibration {w['ours_s'] * 1e6:.1f} us ({w['ours_algo']})")
        out.append(f"    {op}: {verdict} (worst {100 * (w['ratio'] - 1):+.1f}%); the same algorithm at {o['same_algo']} "
                   f"of {n} sizes")
    return out


def written_by_fitted_run(table: dict[str, Any], records: list[str]) -> str | None:
    """The fitted run folder the log lies in, when it also holds NCCL's per-call TUNING lines:
    those were written inside that run's timed loop, so the run is not a clean measurement."""
    if not table.get("per_call_lines") or not table.get("file"):
        return None
    log = Path(table["file"]).resolve()
    for r in records:
        run = Path(r).resolve().parent.parent            # <run>/records/<id>.json
        if run in log.parents:
            return str(run)
    return None
