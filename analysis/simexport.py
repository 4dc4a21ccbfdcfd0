"""A calibration (analysis/projection/) written in the formats of the simulators users already
have, so that fabricbench's measured alpha and bandwidth feed them (docs/projection.md).

Both ASTRA-sim and Calculon price a collective as one latency plus its bytes over one bandwidth:
one line in S. That is the calibration's own form on an NCCL fabric (the textbook ring: each step
pays its latency and its bytes), and the export is then exact at every size. Gloo's ring (form
"gloo", analysis/projection/forms.py gloo_ring) keeps two segments in flight, and its time is two lines:
while a segment's bytes take less than a round trip, a phase pays half of both per segment (its
latency is the ring's, 2(p-1) x alpha for an all_reduce, and its bytes go at up to twice the
rate); above that it pays one round trip and its bytes (2 x alpha, at the bus bandwidth B). One
line cannot hold both, so the export carries one of them (line):
  - by default the ring form's line, 2(p-1) x alpha + S x G(p) / B: the upper envelope of Gloo's
    two, exact for small and for large calls and above Gloo's time between (most at the crossover,
    where a segment's bytes take alpha: `crossover`, which `model export` prints with the error there);
  - with `model export --bytes S` (the job's typical collective, e.g. its gradient bucket), the
    line of Gloo's schedule through S and 2S: exact around S, wrong far from it.

ASTRA-sim, analytical backend: the network YAML that astra-network-analytical's NetworkParser
reads (common/network-parser/NetworkParser.cc: `topology`, `npus_count`, `bandwidth` in GB/s,
`latency` in ns, one list entry per dimension; examples/network/analytical/*.yml). One dimension,
`Switch`: every rank's link to one switch, as the emulated star and a NIC-to-leaf fabric are.
bandwidth = the all_reduce line's bus bandwidth; latency = its latency over the ring's 2(p-1)
steps, halved (a message crosses two links through the switch), so that a ring of one chunk
gives the line back. The schedule itself (two segments in flight, Gloo's size-dependent segment
count) is not the network file's to say: ASTRA-sim sets chunking in its system configuration,
which this export does not write.

Calculon (calculon-ai/calculon, systems/*.json `networks[]`, calculon/network.py): time =
latency + S' / (bandwidth x efficiency), S' = S x scalar + (S x scalar / p) x offset. With
ops all_reduce [2, -1], reduce_scatter and all_gather [1, -1] that is S x G(p), the ring's bytes,
so bandwidth x efficiency = the all_reduce line's bus bandwidth. bandwidth is the link's line
rate when the records know it (efficiency = that bus bandwidth / it), else the bus bandwidth with
efficiency 1. Calculon charges one latency per collective: the all_reduce line's, which
overstates a p-1-step all_gather's by its other half. An all_gather whose line has another bus
bandwidth than the all_reduce's gets its own scalar, so that its bytes cost what its line says.
On a Gloo fabric reduce_scatter is an all_reduce of the whole buffer (torch's ProcessGroupGloo
runs reduce_scatter_tensor as allreduce, then keeps its own chunk): it takes the all_reduce's
scalar there.

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


def _all_reduce(cal: dict[str, Any]) -> dict[str, Any]:
    if "all_reduce" not in cal["ops"]:
        raise pj.UsageError(f"the calibration of {cal['fabric']} has no all_reduce, which every export prices; "
                            "calibrate it (collectives.ops=[all_reduce,...])")
    return cal["ops"]["all_reduce"]


def line(cal: dict[str, Any], op: str, p: int, size: int | None = None) -> tuple[float, float]:
    """(latency s, bus bandwidth bytes/s) of the line T = latency + S x G(p) / bandwidth the export
    carries for op at p ranks: the ring form's (L(p) x the step, B), or with `size` the calibrated
    model's line through size and 2 x size."""
    c = cal["ops"][op]
    L, G = pj.terms(op, p)
    if size is None:
        return L * (c["alpha_s"] + c["kappa_s"] * math.log2(p / 2)), 1 / c["beta_s_per_byte"]
    t1, t2 = pj.op_time(c, op, p, size), pj.op_time(c, op, p, 2 * size)
    slope = (t2 - t1) / size
    return max(0.0, t1 - slope * size), G / slope


def crossover(cal: dict[str, Any], p: int) -> tuple[int, float] | None:
    """Gloo's all_reduce at p ranks: (the size whose segments' bytes take alpha, the ring line's
    error there: its time over the model's, less 1); None for the ring form, or when even a 1 MiB
    segment (Gloo's largest) is shorter than alpha (the schedule's first line at every size)."""
    c = cal["ops"]["all_reduce"]
    a = c["alpha_s"] + c["kappa_s"] * math.log2(p / 2)
    seg = a / c["beta_s_per_byte"]
    if c.get("form") != "gloo" or seg > pj.GLOO_MAX_SEGMENT:
        return None
    size = int(2 * p * seg)
    lat, bus = line(cal, "all_reduce", p)
    ring = lat + size * pj.terms("all_reduce", p)[1] / bus
    return size, ring / pj.op_time(c, "all_reduce", p, size) - 1


def astra_sim(cal: dict[str, Any], npus: int, size: int | None = None) -> str:
    _all_reduce(cal)
    lat, bus = line(cal, "all_reduce", npus, size)
    latency_ns = lat / (2 * (npus - 1)) / 2 * 1e9
    return (f"# fabricbench calibration of {cal['fabric']} (commit {str(cal['code']['commit'])[:12]}, made "
            f"{cal['created']}); ASTRA-sim analytical network config\n"
            "topology: [ Switch ]\n"
            f"npus_count: [ {npus} ]\n"
            f"bandwidth: [ {_plain(bus / 1e9)} ]  # GB/s: the calibrated all_reduce's bus bandwidth{_at(size)}\n"
            f"latency: [ {_plain(latency_ns)} ]  # ns: its latency per ring step, halved (two links per step)\n")


def _plain(x: float) -> str:
    """Six significant digits without an exponent: YAML 1.1 readers (PyYAML) take 4e+06 for a string."""
    s = f"{x:.6g}"
    return s if "e" not in s else f"{float(s):.12f}".rstrip("0").rstrip(".")


def _at(size: int | None) -> str:
    return f" (the line of its time through {pj._size(size)} and twice that)" if size else ""


def calculon(cal: dict[str, Any], size: int, message: int | None = None) -> dict[str, Any]:
    """One entry of a Calculon system's `networks` list (size: its ranks; message: the size whose
    line it carries, or None for the ring form's)."""
    _all_reduce(cal)
    p = max(size, 2)
    lat, bus = line(cal, "all_reduce", p, message)
    bus /= 1e9
    rate = cal.get("line_rate_GBps")
    bw, eff = (rate, bus / rate) if rate and bus <= rate else (bus, 1.0)
    gather = 1.0
    if "all_gather" in cal["ops"]:
        gather = bus / (line(cal, "all_gather", p, message)[1] / 1e9)
    scatter = 2.0 if cal["ops"]["all_reduce"].get("form") == "gloo" else 1.0
    return {"bandwidth": bw, "efficiency": eff, "size": size, "latency": lat,
            "ops": {"p2p": [1.0, None], "reduce_scatter": [scatter, -1], "all_gather": [gather, -1],
                    "all_reduce": [2.0, -1]},
            "must_be_filled": False, "processor_usage": 0.0}


def vidur(cal: dict[str, Any], workers: list[int], sizes: list[int]) -> str:
    """Vidur's all_reduce.csv: a row per (degree, size), times in ms."""
    z = 1.6448536269514722  # the 90% interval's half-width in standard deviations
    rows = []
    for n in workers:
        for s in sizes:
            pr = pj.project(cal, "all_reduce", n, s)
            rows.append((n, s, pr.time_s * 1e3, pr.low_s * 1e3, pr.high_s * 1e3, (pr.high_s - pr.low_s) / 2 / z * 1e3))
    return _vidur_csv(rows)


def _vidur_csv(rows: list[tuple[int, int, float, float, float, float]]) -> str:
    """(degree, size, median, min, max, std) per row, times in ms, as Vidur's all_reduce.csv."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(VIDUR_COLUMNS)
    for i, (n, s, ms, lo, hi, sd) in enumerate(rows):
        w.writerow([i, lo, hi, ms, ms, sd, 0, n, s, "all_reduce", n, n])
    return out.getvalue()


# --- an NCCL calibration (its `nccl` block: two levels, NCCL's cost model) -----------------------
#
# ASTRA-sim gets two dimensions, the node's GPUs and the nodes, each a Switch (NVSwitch inside a
# node, NIC to leaf across): the first dimension's bandwidth is the intra level's bus bandwidth and
# its latency NCCL's NVLink/PCI ring step (Simple) x the fitted factor, the second's the inter
# level's per-GPU bus bandwidth and NCCL's network ring step x its factor, each halved for the two
# links of a switched step. Calculon gets one network per level (the node's GPUs; all ranks), each
# the line of NCCL's model through `message` and twice it. Vidur's tensor-parallel rows sit inside
# one node: priced at the intra level, one node of that many GPUs.

NCCL_MESSAGE = 16 << 20          # the size whose line Calculon carries when --bytes is not given


def nccl_line(cal: dict[str, Any], nodes: int, gpn: int, size: int) -> tuple[float, float]:
    """(latency s, bus bandwidth bytes/s) of the line through NCCL's model's all_reduce time at
    size and 2 x size on nodes x gpn."""
    from analysis.projection import hierarchy as hi

    p = nodes * gpn
    t1 = hi.predict("all_reduce", size, nodes, gpn, cal)["time_s"]
    t2 = hi.predict("all_reduce", 2 * size, nodes, gpn, cal)["time_s"]
    slope = (t2 - t1) / size
    return max(0.0, t1 - slope * size), 2 * (p - 1) / p / slope


def astra_sim_nccl(cal: dict[str, Any], nodes: int, gpn: int) -> str:
    from analysis import nccl_cost as nc

    h = cal["nccl"]
    m = h["measured"]
    hw = nc._HW[h["version"]]
    intra_ns = hw["nvlink" if h["intra"] == "nvlink" else "pci"]["Ring"]["Simple"] * m["intra_lat"] * 1e3 / 2
    net_ns = hw["net"]["Ring"]["Simple"] * m["net_lat"] * 1e3 / 2
    return (f"# fabricbench calibration of {cal['fabric']} (commit {str(cal['code']['commit'])[:12]}, made "
            f"{cal['created']}, NCCL {h['nccl']}); ASTRA-sim analytical network config: the node's GPUs, then the nodes\n"
            "topology: [ Switch, Switch ]\n"
            f"npus_count: [ {gpn}, {nodes} ]\n"
            f"bandwidth: [ {_plain(m['intra_busbw'])}, {_plain(m['inter_busbw'])} ]  # GB/s: the fitted intra- and "
            "inter-node bus bandwidths per GPU\n"
            f"latency: [ {_plain(intra_ns)}, {_plain(net_ns)} ]  # ns: NCCL's ring step (Simple) inside a node and across, "
            "x the fitted factors, halved (two links per step)\n")


def calculon_nccl(cal: dict[str, Any], nodes: int, gpn: int, message: int | None = None) -> list[dict[str, Any]]:
    out = []
    for n, g in ((1, gpn), (nodes, gpn)):
        lat, bus = nccl_line(cal, n, g, message or NCCL_MESSAGE)
        out.append({"bandwidth": bus / 1e9, "efficiency": 1.0, "size": n * g, "latency": lat,
                    "ops": {"p2p": [1.0, None], "reduce_scatter": [1.0, -1], "all_gather": [1.0, -1],
                            "all_reduce": [2.0, -1]},
                    "must_be_filled": False, "processor_usage": 0.0})
    return out


def vidur_nccl(cal: dict[str, Any], degrees: list[int], sizes: list[int]) -> str:
    """Vidur's all_reduce.csv from the intra level: a row per tensor-parallel degree (GPUs of one
    node) and size, NCCL's model's time in ms (no interval for this form yet: min = max = median)."""
    from analysis.projection import hierarchy as hi

    rows = []
    for n in degrees:
        for s in sizes:
            ms = hi.predict("all_reduce", s, 1, n, cal)["time_s"] * 1e3
            rows.append((n, s, ms, ms, ms, 0.0))
    return _vidur_csv(rows)
