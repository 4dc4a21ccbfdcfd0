"""NCCL's algorithm and protocol cost model, ported from its own source, per NCCL version.

NCCL prices every (collective, algorithm, protocol) at communicator init as a latency and a
bandwidth (src/graph/tuning.cc, ncclTopoTuneModel), then for each call of n bytes takes the
fastest `latency + n / bandwidth`, with a per-size correction for Tree and a latency factor for
a multi-node Ring/Simple all_reduce (tuning.cc, ncclTopoGetAlgoTime; the minimum in
src/enqueue.cc, updateCollCostTable and topoGetAlgoInfo). This module is that arithmetic, in
NCCL's own units (microseconds, GB/s), for the two releases read line by line:

    "2.23"  NCCL v2.23.4-1 (stands for 2.2x: the tables as 2.23 ships them)
    "2.30"  NCCL v2.30.7-1

Every constant below names the array of tuning.cc it comes from. What NCCL reads from the
machine (the search's per-channel bandwidths, channel counts, link types, NVLS and CollNet
support, CPU vendor) is a `Topology`; a calibration replaces the hardware part with measured
numbers (`Measured`: the bus bandwidth of a one-node ring and of a multi-node ring per GPU, and
factors on NCCL's NVLink/PCI and network step latencies), NCCL's algorithm choice and base
latencies stay. Everything here is a pure function of its arguments; nothing runs NCCL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")   # init.cc ncclAlgoStr
PROTOS = ("LL", "LL128", "Simple")                                                   # init.cc ncclProtoStr
FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")           # init.cc ncclFuncStr
FUNC_OF = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
           "broadcast": "Broadcast", "reduce": "Reduce"}
VERSIONS = ("2.23", "2.30")
MAX_DIRECT_ARITY = 7           # device.h NCCL_MAX_DIRECT_ARITY (2.23.4, 2.30.7)
MAX_NVLS_ARITY = 32            # device.h NCCL_MAX_NVLS_ARITY (2.23.4, 2.30.7)


def _by_algo(rows: list[tuple[float, float, float]]) -> dict[str, dict[str, float]]:
    return {a: dict(zip(PROTOS, r)) for a, r in zip(ALGOS, rows)}


# baseLat (2.23.4 tuning.cc; 2.30.7 ncclTunerConstantsDefaults.baseLatencies), us. 2.23 has no
# PAT row (zero) and adds PAT's 8 us inside ncclTopoTuneModel instead.
_BASE = {
    "2.23": _by_algo([(6.8, 14.0, 8.4), (6.6, 14.0, 8.4), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0)]),
    "2.30": _by_algo([(6.8, 14.0, 8.4), (6.6, 14.0, 8.4), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (8.0, 8.0, 8.0)]),
}
# hwLat [NVLINK, PCI, NET] (2.23.4 tuning.cc hwLat; 2.30.7 ncclTunerConstantsDefaults.hwLatencies), us per step
_HW_23 = {
    "nvlink": _by_algo([(.6, 1.25, 4.0), (.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25), (0, 0, 25), (0, 0, 0)]),
    "pci": _by_algo([(1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 0), (0, 0, 0), (0, 0, 0)]),
    "net": _by_algo([(5.0, 8.5, 14), (2.7, 4.0, 14.0), (0, 0, 31), (0, 0, 30), (0, 0, 18), (0, 0, 14), (0, 0, 0)]),
}
_HW = {
    "2.23": _HW_23,
    "2.30": {
        "nvlink": _by_algo([(.6, 1.25, 4.0), (.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25), (0, 0, 25), (0, 0, 4.0)]),
        "pci": _by_algo([(1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 0), (0, 0, 0), (0, 0, 4.0)]),
        "net": _by_algo([(5.0, 8.5, 14), (2.7, 4.0, 14.0), (0, 0, 31), (0, 0, 30), (0, 0, 18), (0, 0, 20.9), (0, 0, 14)]),
    },
}
# [compute capability index][nodes index: 1, 2, >2] (llMaxBws, perChMax*Bws; the same in both
# releases for Volta/Ampere/Hopper, 2.30 adds Blackwell). llMaxBws' first index is the GPU on one
# node and the CPU vendor (0 Intel, 1 AMD) on several.
_LL_MAX = [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [2 * 141.0, 2 * 45.0, 2 * 35.0]]
_RING_LL128 = [[20.0] * 3, [20.0] * 3, [36.7] * 3, [40.0] * 3]
_TREE_LL128 = [[20.0] * 3, [20.0] * 3, [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]]
_TREE = [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]]
_NVLS_TREE = [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]]   # 2.30.7 only
_NVLS_EFF = [0.0, 0.0, 0.85, 0.74]                                                         # 2.30.7 nvlsEfficiency
# treeCorrectionFactor [protocol][log2(bytes / 64)] (2.23.4: 23 columns; 2.30.7 adds a 24th, 1.0/1.0/.9)
_TREE_CORR = {
    "LL": [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0],
    "LL128": [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0],
    "Simple": [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9],
}
NET_OVERHEAD = {"intel": 1.0, "amd": 2.0, "other": 1.0}    # getNetOverhead, us (x3 for Simple)
PAT_FACTOR = {"2.23": .85, "2.30": .75}                    # "if (a == NCCL_ALGO_PAT) busBw *= ..."


def version_of(text: str | None) -> str | None:
    """The ported release for an NCCL version string ("2.21.5", "2.30.7+cuda12"): "2.23" for
    2.20-2.29, "2.30" for 2.30.x, None for any other (not ported)."""
    try:
        major, minor = (int(x) for x in str(text).split("+")[0].split(".")[:2])
    except (ValueError, TypeError):
        return None
    if major == 2 and 20 <= minor <= 29:
        return "2.23"
    if major == 2 and minor == 30:
        return "2.30"
    return None


@dataclass(frozen=True)
class Graph:
    """One algorithm's graph as NCCL's topology search leaves it (struct ncclTopoGraph):
    channels, per-channel GB/s inside a node and across, the network's own latency (us, 0 unless
    the net plugin reports one) and the intra-node link."""
    n_channels: int
    bw_intra: float
    bw_inter: float
    latency_inter: float = 0.0
    intra: str = "nvlink"            # "nvlink" | "pci" (typeIntra == LINK_NVL or not)
    same_channels: bool = True


NO_GRAPH = Graph(0, 0.0, 0.0)


@dataclass(frozen=True)
class Topology:
    nodes: int
    gpus_per_node: int
    ring: Graph
    tree: Graph | None = None            # None: the ring's graph
    nvls: Graph | None = None            # None: no NVLS (no NVSwitch multicast, or not Hopper+)
    collnet: Graph | None = None         # None: no CollNet (SHARP) plugin
    compcap: int = 90
    cpu: str = "intel"
    ll128: bool = True                   # LL128 enabled (NVLink inside the node, PXN or closer to the NIC)
    tree_pattern: bool = False           # the tree graph's pattern is NCCL_TOPO_PATTERN_TREE (x.85)

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def graph(self, algo: str) -> Graph | None:
        if algo in ("Ring", "PAT"):
            return self.ring
        if algo == "Tree":
            return self.tree or self.ring
        if algo in ("NVLS", "NVLSTree"):
            return self.nvls
        return self.collnet


@dataclass(frozen=True)
class Measured:
    """A calibration's numbers in NCCL's place: bus bandwidths (GB/s per GPU, all channels) of a
    one-node ring and of a multi-node ring, and factors on NCCL's hardware step latencies inside
    a node (NVLink or PCI) and across (NET, its net overhead included). None keeps NCCL's."""
    intra_busbw: float | None = None
    inter_busbw: float | None = None
    intra_lat: float = 1.0
    net_lat: float = 1.0


def _compcap_index(cc: int, version: str) -> int:
    if cc >= 100 and version == "2.30":
        return 3
    return 2 if cc >= 90 else 1 if cc >= 80 else 0


def _log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else -1       # utils.h log2i -> bitops.h log2Down (-1 for 0)


def _nsteps(func: str, p: int) -> int:
    return 2 * (p - 1) if func == "AllReduce" else p - 1 if func in ("AllGather", "ReduceScatter") else p


def _pat_enabled(t: Topology, version: str) -> bool:
    # ncclPatEnable: one GPU per node, the network on the host (2.30 also needs sm60)
    return t.nodes == t.ranks and (version == "2.23" or t.compcap >= 60)


def _skip(func: str, algo: str, proto: str, t: Topology, version: str) -> bool:
    if func in ("Broadcast", "Reduce") and algo != "Ring":
        return True
    if func in ("ReduceScatter", "AllGather") and algo not in ("PAT", "Ring", "NVLS", "CollNetDirect"):
        return True
    if func == "AllReduce" and algo == "PAT":
        return True
    if algo in ("NVLS", "NVLSTree") and proto != "Simple":
        return True
    return func in ("ReduceScatter", "AllGather") and algo == "PAT" and (proto != "Simple" or not _pat_enabled(t, version))


def _bus_bw(func: str, algo: str, proto: str, t: Topology, g: Graph, version: str) -> float:
    """ncclTopoTuneModel's bandwidth of one entry, as the algorithm bandwidth it stores."""
    ci, n2 = _compcap_index(t.compcap, version), min(t.nodes, 3) - 1
    ll_max = _LL_MAX[ci if t.nodes == 1 else (1 if t.cpu == "amd" else 0)][n2]
    ppn, p, nsteps = t.ranks / t.nodes, t.ranks, _nsteps(func, t.ranks)
    collnet = algo in ("CollNetDirect", "CollNetChain")
    bw = g.bw_intra if t.nodes <= 2 or collnet else g.bw_inter
    if algo in ("NVLS", "NVLSTree"):
        if version == "2.23":
            bw = min(g.bw_intra, g.bw_inter) if algo == "NVLS" else min(g.bw_intra, g.bw_inter if t.nodes <= 2 else g.bw_inter / 2)
        else:
            if g.n_channels < 2:
                return 0.0
            intra = g.bw_intra * _NVLS_EFF[ci] * (g.n_channels - 1) / g.n_channels
            intra *= 2.0 if func == "AllReduce" else (ppn - 1) / ppn
            inter = g.bw_inter * (2 if t.nodes <= 2 and algo == "NVLSTree" else 1)
            bw = min(intra, inter, _NVLS_TREE[ci][n2] if algo == "NVLSTree" else math.inf)
    bus = g.n_channels * bw
    if algo == "Ring" and proto == "LL":
        bus = min(ll_max, bus * .5)
    if algo == "Ring" and proto == "LL128":
        bus = min(bus * .92, g.n_channels * _RING_LL128[ci][n2])
    if algo == "Tree" and func == "AllReduce":
        bus = min(bus * .92, g.n_channels * _TREE[ci][n2])
    if algo == "Tree" and proto == "LL":
        bus = min(bus / 3.8, ll_max)
    if algo == "Tree" and proto == "LL128":
        bus = min(bus * (7.0 / 9.0 if t.nodes == 1 else 120.0 / 128.0), g.n_channels * _TREE_LL128[ci][n2])
    if algo == "Tree" and t.tree_pattern:
        bus *= .85
    if algo == "PAT":
        bus *= PAT_FACTOR[version]
    if collnet and proto != "Simple":
        bus = 0.0
    if algo == "CollNetDirect" and proto == "Simple":
        if func in ("AllGather", "ReduceScatter"):
            if t.nodes > 1:
                bus = 0.0          # needs the CollNet plugin's iallgather/ireducescatter and 1 GPU per NIC head
            elif version == "2.23":
                w = (ppn - 1) / (8 - 1)
                bus = ppn * bw * (w * .85 + (1 - w) * .95)
            else:
                bus = ppn * min(g.bw_intra, g.bw_inter * .9)
        else:
            factor = ppn / g.n_channels
            factor -= (factor - 1) / 2
            bus /= factor
            if t.compcap >= 90:
                bus *= .85
    if version == "2.30" and algo == "NVLS" and func in ("AllGather", "ReduceScatter") and t.nodes > 1:
        bus = 0.0
    if not (algo != "Ring" and func in ("AllGather", "ReduceScatter")):
        if algo == "Ring" or (version == "2.30" and algo in ("NVLS", "NVLSTree")):
            bus *= p / nsteps
        elif algo in ("NVLS", "NVLSTree"):
            bus *= 5.0 / 6.0
        else:
            bus *= .5
    return bus


def _latency(func: str, algo: str, proto: str, t: Topology, g: Graph, version: str, m: Measured) -> float:
    """ncclTopoTuneModel's latency of one entry, us, with the measured step-latency factors."""
    hw = _HW[version]
    intra_hw = "nvlink" if g.intra == "nvlink" else "pci"
    ppn, p, nn = t.ranks / t.nodes, t.ranks, t.nodes
    nsteps = _nsteps(func, p)
    lat = _BASE[version][algo][proto]
    intra = hw[intra_hw][algo][proto] * m.intra_lat
    inter = (hw["net"]["Tree"][proto] if ppn == 1 else hw["net"][algo][proto]) * m.net_lat
    inter += g.latency_inter * (2 if proto == "Simple" else 1)     # the flush's extra latency on Simple
    if algo == "Ring":
        step = hw[intra_hw if nn == 1 else "net"]["Ring"][proto] * (m.intra_lat if nn == 1 else m.net_lat)
        if func in ("Reduce", "Broadcast"):
            if g.same_channels:
                return lat + step
            if proto == "Simple":
                step = hw[intra_hw if nn == 1 else "net"]["Tree"][proto] * (m.intra_lat if nn == 1 else m.net_lat)
            return lat + nsteps * step
        # the host cost of posting a network step (getNetOverhead): not a link latency, not scaled
        overhead = NET_OVERHEAD.get(t.cpu, 1.0) * (3 if proto == "Simple" else 1) if nn > 1 else 0.0
        intra = max(intra, overhead)
        n_inter = 0 if nn == 1 else 2 * (nn - 1) if func == "AllReduce" else nn - 1
        return lat + (nsteps - n_inter) * intra + n_inter * inter
    if algo == "Tree":
        return lat + (2 * ((p // nn - 1) * intra + _log2i(nn) * inter) if func == "AllReduce" else 0.0)
    if algo == "CollNetDirect":
        return lat + 2 * (min(1, p // nn - 1) * intra + (p // nn - 1) * 0.4) + inter
    if algo == "CollNetChain":
        return lat + 2 * (p // nn - 1) * intra + inter
    if algo == "NVLS":
        return intra + (inter if nn > 1 else 0.0)
    if algo == "NVLSTree":
        return lat + intra + 2 * _log2i(nn) * inter
    if func in ("AllGather", "ReduceScatter"):           # PAT
        return (8.0 if version == "2.23" else lat) + _log2i(nn) * (inter / 3.5) + p * 2.8
    return lat


def with_measured(t: Topology, m: Measured) -> Topology:
    """The topology with measured bus bandwidths in place of the search's: a one-node graph's
    per-channel bandwidth is intra_busbw / channels; a multi-node graph's (ring, tree, PAT, and
    NVLS's network side) inter_busbw / channels, NVLS's NVLink side intra_busbw / its channels."""
    def ch(g: Graph | None, nvlink_side: bool) -> Graph | None:
        if g is None:
            return None
        intra, inter = g.bw_intra, g.bw_inter
        if t.nodes == 1 and m.intra_busbw:
            intra = inter = m.intra_busbw / g.n_channels
        elif t.nodes > 1:
            if m.inter_busbw:
                inter = m.inter_busbw / g.n_channels
                intra = intra if nvlink_side else inter
            if nvlink_side and m.intra_busbw:
                intra = m.intra_busbw / g.n_channels
        return replace(g, bw_intra=intra, bw_inter=inter)
    return replace(t, ring=ch(t.ring, False), tree=ch(t.tree, False), nvls=ch(t.nvls, True), collnet=ch(t.collnet, True))


def tune(t: Topology, version: str, m: Measured | None = None) -> dict[str, dict[str, tuple[float, float]]]:
    """ncclTopoTuneModel's table, {func: {"Algo/Proto": (latency_us, algbw_GBps)}} with every
    entry NCCL prints (0 bandwidth where it disables one), as its TUNING lines show it."""
    if version not in VERSIONS:
        raise ValueError(f"NCCL {version} is not ported (ported: {', '.join(VERSIONS)})")
    m = m or Measured()
    t = with_measured(t, m) if (m.intra_busbw or m.inter_busbw) else t
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for func in FUNCS:
        row = out.setdefault(func, {})
        for algo in ALGOS:
            g = t.graph(algo)
            for proto in PROTOS:
                key = f"{algo}/{proto}"
                if t.ranks <= 1 or _skip(func, algo, proto, t, version):
                    row[key] = (0.0, 0.0)
                    continue
                if g is None:
                    # an absent graph has no channels: 2.30 skips NVLS below 2 channels before
                    # pricing it; every other entry keeps its latency at zero bandwidth
                    if version == "2.30" and algo in ("NVLS", "NVLSTree"):
                        row[key] = (0.0, 0.0)
                    else:
                        row[key] = (_latency(func, algo, proto, t, NO_GRAPH, version, m), 0.0)
                    continue
                bw = _bus_bw(func, algo, proto, t, g, version)
                lat = _latency(func, algo, proto, t, g, version, m)
                if proto == "LL128" and not t.ll128:
                    bw = 0.0
                if algo == "NVLSTree" and t.nodes == 1:
                    bw = 0.0                            # "Disable NVLS Tree on a single node"
                if algo == "NVLS" and t.nodes > 1 and t.collnet is None:
                    bw = 0.0                            # multi-node NVLS needs CollNet
                row[key] = (lat, bw)
    return out


def algo_time(table: dict[str, dict[str, tuple[float, float]]], t: Topology, func: str, key: str,
              nbytes: int, version: str) -> float | None:
    """ncclTopoGetAlgoTime for one call (numPipeOps 1): microseconds, None when disabled."""
    lat, bw = table[func][key]
    if bw <= 0:
        return None
    algo, proto = key.split("/")
    log_size = _log2i(nbytes >> 6)
    if algo == "Tree" and func == "AllReduce" and 0 <= log_size < 23:
        bw *= _TREE_CORR[proto][log_size]
    if (version == "2.30" and algo == "NVLSTree" and func == "AllReduce" and 0 <= log_size < 24
            and t.compcap >= 100 and t.cpu in ("intel", "amd")):
        bw *= _TREE_CORR[proto][log_size]
    if (algo == "Ring" and proto == "Simple" and t.nodes > 1 and func == "AllReduce"
            and nbytes // (t.ring.n_channels * t.ranks) >= 64):
        lat *= 1.9 if t.compcap < 80 else 1.4              # "Plateau effect of ring"
    return lat + nbytes / (1000 * bw)


def _usable(t: Topology, func: str, algo: str) -> bool:
    # enqueue.cc updateCollCostTable: what it skips before timing
    if algo in ("CollNetDirect", "CollNetChain") and t.collnet is None:
        return False
    if algo in ("CollNetDirect", "CollNetChain") and t.gpus_per_node > MAX_DIRECT_ARITY + 1:
        return False
    if algo in ("NVLS", "NVLSTree") and (t.nvls is None or (func != "AllReduce" and t.gpus_per_node > MAX_NVLS_ARITY)):
        return False
    return not (algo == "NVLS" and t.collnet is None and t.nodes > 1)


@dataclass(frozen=True)
class Choice:
    algo: str
    proto: str
    time_s: float
    costs: dict[str, float] = field(default_factory=dict, compare=False)   # every usable entry, seconds

    @property
    def name(self) -> str:
        return f"{self.algo}/{self.proto}"


def choose(t: Topology, op: str, nbytes: int, version: str, m: Measured | None = None,
           table: dict[str, Any] | None = None) -> Choice:
    """The algorithm and protocol NCCL picks for one call of `nbytes` (the fastest entry, ties
    to the first in NCCL's order, as topoGetAlgoInfo), and its predicted time in seconds."""
    func = FUNC_OF[op]
    if t.ranks <= 1:
        return Choice("Ring", "Simple", 0.0)
    table = table or tune(t, version, m)
    tm = with_measured(t, m) if m and (m.intra_busbw or m.inter_busbw) else t
    costs = {}
    for algo in ALGOS:
        if not _usable(tm, func, algo):
            continue
        for proto in PROTOS:
            us = algo_time(table, tm, func, f"{algo}/{proto}", nbytes, version)
            if us is not None and us >= 0:
                costs[f"{algo}/{proto}"] = us * 1e-6
    if not costs:
        raise ValueError(f"no NCCL algorithm for {op} on {t.nodes} x {t.gpus_per_node}")
    best = min(costs, key=costs.__getitem__)
    a, p = best.split("/")
    return Choice(a, p, costs[best], costs)


def tuning_lines(table: dict[str, dict[str, tuple[float, float]]], threads: dict[str, int] | None = None) -> list[str]:
    """The table as NCCL 2.19+ prints it at INFO/TUNING (tuning.cc, ncclTopoTuneModel): blocks of
    three algorithms, a "%8.1f/%6.1f |" cell per protocol, the bodies that follow "NCCL INFO "."""
    out = []
    for b in range(0, len(ALGOS), 3):
        block = ALGOS[b:b + 3]
        out.append("  Algorithm   |" + "".join(f" {'':>14}   {a:>14}   {'':>14} |" for a in block))
        out.append("  Protocol    |" + "".join(f" {p:>14} |" for _ in range(3) for p in PROTOS))
        out.append(" Max NThreads |" + "".join(f" {(threads or {}).get(f'{a}/{p}', 0):>14d} |" for a in block for p in PROTOS))
        for func in FUNCS:
            out.append(f"{func:>13} |" + "".join(f"{table[func][f'{a}/{p}'][0]:8.1f}/{table[func][f'{a}/{p}'][1]:6.1f} |"
                                                  for a in block for p in PROTOS))
    return out
