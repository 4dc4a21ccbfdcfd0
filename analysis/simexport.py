"""A calibration (analysis/projection.py) written in the formats of the simulators users already
have, so that fabricbench's measured alpha and bandwidth feed them (docs/projection.md).

ASTRA-sim, analytical backend: the network YAML that astra-network-analytical's NetworkParser
reads (common/network-parser/NetworkParser.cc: `topology`, `npus_count`, `bandwidth` in GB/s,
`latency` in ns, one list entry per dimension; examples/network/analytical/*.yml). One dimension,
`Switch`: every rank's link to one switch, as the emulated star and a NIC-to-leaf fabric are.
bandwidth = B (a ring's bus bandwidth is what each rank's link carries); latency = half the
calibrated per-step time at that size (a message crosses two links through the switch).

Calculon (calculon-ai/calculon, systems/*.json `networks[]`, calculon/network.py): time =
latency + S' / (bandwidth x efficiency), S' = S x scalar + (S x scalar / p) x offset. With
ops all_reduce [2, -1], reduce_scatter and all_gather [1, -1] that is S x G(p), the ring's bytes,
so bandwidth x efficiency = B. bandwidth is the link's line rate when the records know it
(efficiency = B / it), else B with efficiency 1. Calculon charges one latency per collective:
the export puts the calibrated all_reduce's latency term at the network's size there (2(p-1)
steps), which overstates a p-1-step all_gather's by its other half.

Vidur (microsoft/vidur, data/profiling/network/<sku>/all_reduce.csv, read by
SklearnExecutionTimePredictor._load_all_reduce_df: rows with num_workers == devices_per_node ==
the tensor-parallel degree and collective == all_reduce; target time_stats.all_reduce.median in
ms): per degree and size the projected median, with min/max the 90% interval's ends and std the
interval's half-width / 1.645.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from analysis import projection as pj

VIDUR_COLUMNS = ["", "time_stats.all_reduce.min", "time_stats.all_reduce.max", "time_stats.all_reduce.mean",
                 "time_stats.all_reduce.median", "time_stats.all_reduce.std", "rank", "num_workers", "size",
                 "collective", "devices_per_node", "max_devices_per_node"]


def _step_s(c: dict[str, Any], p: int) -> float:
    return c["alpha_s"] + c["kappa_s"] * math.log2(p / 2)


def _all_reduce(cal: dict[str, Any]) -> dict[str, Any]:
    if "all_reduce" not in cal["ops"]:
        raise pj.UsageError(f"the calibration of {cal['fabric']} has no all_reduce, which every export prices; "
                            "calibrate it (collectives.ops=[all_reduce,...])")
    return cal["ops"]["all_reduce"]


def astra_sim(cal: dict[str, Any], npus: int) -> str:
    c = _all_reduce(cal)
    bw = c["bandwidth_GBps"]
    latency_ns = _step_s(c, npus) / 2 * 1e9
    return (f"# fabricbench calibration of {cal['fabric']} (commit {str(cal['code']['commit'])[:12]}, made "
            f"{cal['created']}); ASTRA-sim analytical network config\n"
            "topology: [ Switch ]\n"
            f"npus_count: [ {npus} ]\n"
            f"bandwidth: [ {bw:.6g} ]  # GB/s: the calibrated all_reduce bus bandwidth\n"
            f"latency: [ {latency_ns:.6g} ]  # ns: half the calibrated per-step time (two links per step)\n")


def calculon(cal: dict[str, Any], size: int) -> dict[str, Any]:
    """One entry of a Calculon system's `networks` list."""
    c = _all_reduce(cal)
    bus = c["bandwidth_GBps"]
    line = cal.get("line_rate_GBps")
    bw, eff = (line, bus / line) if line and bus <= line else (bus, 1.0)
    return {"bandwidth": bw, "efficiency": eff, "size": size,
            "latency": 2 * (size - 1) * _step_s(c, max(size, 2)),
            "ops": {"p2p": [1.0, None], "reduce_scatter": [1.0, -1], "all_gather": [1.0, -1],
                    "all_reduce": [2.0, -1]},
            "must_be_filled": False, "processor_usage": 0.0}


def vidur(cal: dict[str, Any], workers: list[int], sizes: list[int]) -> str:
    """Vidur's all_reduce.csv: a row per (degree, size), times in ms."""
    z = 1.6448536269514722  # the 90% interval's half-width in standard deviations
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(VIDUR_COLUMNS)
    i = 0
    for n in workers:
        for s in sizes:
            pr = pj.project(cal, "all_reduce", n, s)
            ms = pr.time_s * 1e3
            w.writerow([i, pr.low_s * 1e3, pr.high_s * 1e3, ms, ms, (pr.high_s - pr.low_s) / 2 / z * 1e3, 0, n, s,
                        "all_reduce", n, n])
            i += 1
    return out.getvalue()
