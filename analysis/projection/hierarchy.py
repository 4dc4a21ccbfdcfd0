"""Scale as a topology: an NCCL calibration per level, projected through NCCL's own cost model.

A communicator's scale is nodes x GPUs per node, read from its record (world.nodes,
collectives.ranks_per_node and pattern), not its rank count alone. Two levels are calibrated:

  intra   inside a node (NVLink or PCI), from communicators on one node: the bus bandwidth of a
          one-node ring and a factor on NCCL's NVLink/PCI step latencies;
  inter   across nodes (the NIC path), from communicators on 2+ nodes: the per-GPU bus bandwidth
          of a multi-node ring and a factor on NCCL's network step latencies.

Both are fitted at once by least squares on log time through analysis.nccl_cost (the time of
the algorithm and protocol NCCL would pick at each cell), so a cell NCCL runs as a tree informs
the same numbers as one it runs as a ring. A level no cell measured keeps NCCL's own constant
(a weak pull to it, PRIOR), and the calibration says which levels were measured. alltoall has
no NCCL tuning entry (it is point-to-point): its time is a per-peer latency plus the larger of
its NVLink bytes over the intra bandwidth and its network bytes over the inter bandwidth.

Every function here is pure: predict(op, size, nodes, gpus_per_node, calibration).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from statistics import median
from typing import Any, Iterable

from analysis import nccl_cost as nc
from analysis.projection.forms import MODEL_ONLY
from analysis.projection.lines import _size
from workloads.core.errors import UsageError

PRIOR = 1e-3                 # weight of the pull of an unmeasured factor to NCCL's constant
CHANNELS = 16                # the ring graph's channels assumed when no log says (per-channel caps, plateau)
NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter")


def level_of(rec: dict[str, Any], p: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of a p-rank communicator of the record: the whole world's layout
    when it spans the world; one rank per node for `pattern: one_per_node`; a pair across two
    nodes for `pattern: pairs` (inside the one node of a one-node job); else packed on nodes of
    ranks_per_node."""
    world = rec.get("world") or {}
    coll = rec.get("collectives") or {}
    rpn = int(coll.get("ranks_per_node") or world.get("local_world_size") or p)
    nodes = int(world.get("nodes") or max(1, int(world.get("world_size") or p) // max(1, rpn)))
    if coll.get("pattern") == "one_per_node":
        return p, 1
    if coll.get("pattern") == "pairs":            # rank r with r + world/2: across two nodes when there are two
        return (2, 1) if nodes >= 2 else (1, 2)
    if p == int(world.get("world_size") or p):
        return (nodes, p // nodes) if p % nodes == 0 else (1, p)
    return (1, p) if p <= rpn else (p // rpn, rpn)


def nccl_of(records: Iterable[dict[str, Any]]) -> str | None:
    """The one NCCL version of the records (fingerprint.nccl), None when none ran NCCL; a
    UsageError when they mix versions (a calibration is of one NCCL)."""
    vs = {str((r.get("fingerprint") or {}).get("nccl")) for r in records if (r.get("fingerprint") or {}).get("nccl")}
    if len(vs) > 1:
        raise UsageError(f"these records ran NCCL {', '.join(sorted(vs))}: fit one version at a time "
                         "(select the records of one install)")
    return vs.pop() if vs else None


def cells(records: Iterable[dict[str, Any]], ops: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Median time per (op, nodes, GPUs per node, size) of the records' timed cells."""
    acc: dict[tuple[str, int, int, int], list[float]] = {}
    want = set(ops) if ops else None
    for rec in records:
        for row in rec.get("rows") or []:
            op = row.get("op")
            cell = next((row[k] for k in ("out_of_place", "in_place") if row.get(k) and row[k].get("time_us")), None)
            if cell is None or not row.get("size") or (want and op not in want):
                continue
            p = int(row.get("group_size") or (rec.get("world") or {}).get("world_size") or 0)
            if p < 2:
                continue
            n, g = level_of(rec, p)
            acc.setdefault((op, n, g, int(row["size"])), []).append(cell["time_us"] / 1e6)
    return [{"op": op, "nodes": n, "gpus_per_node": g, "size": s, "time_s": median(v)}
            for (op, n, g, s), v in sorted(acc.items())]


def base_topology(nodes: int, gpn: int, channels: int = CHANNELS, intra: str = "nvlink", nvls: bool = False,
                  compcap: int = 90, cpu: str = "intel") -> nc.Topology:
    """The topology NCCL's search would leave on a node of gpn GPUs (bandwidths are placeholders
    that Measured replaces): `channels` ring/tree channels; NVLS with as many when asked."""
    g = nc.Graph(channels, 20.0, 20.0, intra=intra)
    return nc.Topology(nodes, gpn, g, nvls=nc.Graph(channels, 20.0, 20.0, intra=intra) if nvls else None,
                       compcap=compcap, cpu=cpu)


def _measured(x: list[float]) -> nc.Measured:
    return nc.Measured(intra_busbw=math.exp(x[0]), intra_lat=math.exp(x[1]), inter_busbw=math.exp(x[2]),
                       net_lat=math.exp(x[3]))


def _a2a_time(size: float, nodes: int, gpn: int, lat_s: float, intra_GBps: float, inter_GBps: float) -> float:
    """alltoall: each rank sends size/p to each of p-1 peers, gpn-1 of them over NVLink and
    p-gpn over the network; the two move at once, so the slower side sets the time."""
    p = nodes * gpn
    nvl, net = size * (gpn - 1) / p, size * (p - gpn) / p
    return (p - 1) * lat_s + max(nvl / (intra_GBps * 1e9), net / (inter_GBps * 1e9) if net else 0.0)


def predict(op: str, size: int, nodes: int, gpn: int, cal: dict[str, Any]) -> dict[str, Any]:
    """One call's time (s) on nodes x gpn GPUs from an NCCL calibration's `nccl` block, with the
    algorithm and protocol NCCL would pick there (alltoall: "p2p", its bytes split)."""
    h = cal["nccl"]
    t = base_topology(nodes, gpn, h["channels"], h["intra"], h["nvls"], h["compcap"], h["cpu"])
    if op == "alltoall":
        a = h["alltoall"]
        if a is None:
            raise UsageError("this calibration has no alltoall; sweep alltoall at one node and at two or more")
        return {"time_s": _a2a_time(size, nodes, gpn, a["lat_s"], a["intra_GBps"], a["inter_GBps"]), "algo": "p2p",
                "proto": "Simple"}
    m = nc.Measured(**h["measured"])
    ch = nc.choose(t, op, size, h["version"], m)
    return {"time_s": ch.time_s, "algo": ch.algo, "proto": ch.proto}


def _fit_nccl(cs: list[dict[str, Any]], version: str, shape: dict[str, Any]) -> tuple[list[float], float]:
    from scipy.optimize import least_squares

    topo = {(c["nodes"], c["gpus_per_node"]): base_topology(c["nodes"], c["gpus_per_node"], **shape) for c in cs}
    has_intra = any(c["nodes"] == 1 for c in cs)
    has_inter = any(c["nodes"] > 1 for c in cs)
    y = [math.log(c["time_s"]) for c in cs]

    def resid(x):
        m = _measured(list(x))
        tables = {k: nc.tune(t, version, m) for k, t in topo.items()}
        out = [math.log(nc.choose(topo[k], c["op"], c["size"], version, m, tables[k]).time_s) - v
               for c, v in zip(cs, y) for k in [(c["nodes"], c["gpus_per_node"])]]
        # a factor no cell informs stays near NCCL's own constant
        out += [PRIOR * x[1], PRIOR * x[3]]
        out += [PRIOR * (x[0] - x0[0])] if not has_intra else []
        out += [PRIOR * (x[2] - x0[2])] if not has_inter else []
        return out

    # start from the bandwidth a large call of the fastest cell shows (busbw of a ring)
    big = max(cs, key=lambda c: c["size"])
    p = big["nodes"] * big["gpus_per_node"]
    bus = big["size"] / big["time_s"] / 1e9 * (2 * (p - 1) / p if big["op"] == "all_reduce" else (p - 1) / p)
    x0 = [math.log(bus), 0.0, math.log(bus), 0.0]
    best = None
    for start in (x0, [x0[0] + 0.7, 0.7, x0[2] + 0.7, 0.7], [x0[0] - 0.3, -0.7, x0[2] - 0.3, -0.7]):
        r = least_squares(resid, start, diff_step=1e-4, xtol=1e-12, ftol=1e-12, max_nfev=400)
        if best is None or r.cost < best.cost:
            best = r
    n = len(cs)
    rms = math.sqrt(sum(v * v for v in best.fun[:n]) / n)
    return list(best.x), rms


def _fit_a2a(cs: list[dict[str, Any]]) -> dict[str, float] | None:
    from scipy.optimize import least_squares

    a2a = [c for c in cs if c["op"] == "alltoall"]
    if len({(c["nodes"], c["gpus_per_node"]) for c in a2a}) < 2:
        return None
    y = [math.log(c["time_s"]) for c in a2a]

    def resid(x):
        return [math.log(_a2a_time(c["size"], c["nodes"], c["gpus_per_node"], *map(math.exp, x))) - v for c, v in zip(a2a, y)]

    r = least_squares(resid, [math.log(5e-6), math.log(100.0), math.log(20.0)], diff_step=1e-4, max_nfev=400)
    lat, intra, inter = map(math.exp, r.x)
    return {"lat_s": lat, "intra_GBps": intra, "inter_GBps": inter}


def shape_of(table: dict[str, Any] | None) -> dict[str, Any]:
    """What NCCL's own table (analysis.nccl_model.read) says of the topology the fit assumes:
    NVLS when its all_reduce has an NVLS or NVLSTree entry with bandwidth (NVLink SHARP found)."""
    if not table:
        return {}
    ar = (table.get("cells") or {}).get("AllReduce") or {}
    return {"nvls": any(ar.get(k, (0, 0))[1] > 0 for k in ("NVLS/Simple", "NVLSTree/Simple"))}


def fit(records: list[dict[str, Any]], nccl: str | None = None, **shape: Any) -> dict[str, Any]:
    """The calibration's `nccl` block from NCCL records: the version, the measured levels and
    the fitted numbers that replace NCCL's hardware constants (`shape`: channels, intra, nvls,
    compcap, cpu of the topology NCCL found, where known)."""
    nccl = nccl or nccl_of(records)
    version = nc.version_of(nccl)
    if version is None:
        raise UsageError(f"NCCL {nccl}: its cost model is not ported here (ported: 2.20-2.29 as 2.23.4, "
                         "2.30.x as 2.30.7); fit with `--form ring` for the flat ring")
    cs = cells(records)
    coll = [c for c in cs if c["op"] in NCCL_OPS]
    if not coll:
        raise UsageError("no all_reduce, all_gather or reduce_scatter in these records")
    shape = {"channels": CHANNELS, "intra": "nvlink", "nvls": False, "compcap": 90, "cpu": "intel"} | shape
    x, rms = _fit_nccl(coll, version, {k: shape[k] for k in ("channels", "intra", "nvls", "compcap", "cpu")})
    m = _measured(x)
    levels = {}
    for name, pick in (("intra", lambda c: c["nodes"] == 1), ("inter", lambda c: c["nodes"] > 1)):
        at = sorted({(c["nodes"], c["gpus_per_node"]) for c in coll if pick(c)})
        levels[name] = {"measured_at": [list(a) for a in at]}
    return shape | {
        "nccl": nccl, "version": version, "measured": asdict(m),
        "levels": levels, "rms_log_error": rms,
        "gpus_per_node": sorted({c["gpus_per_node"] for c in coll if c["nodes"] > 1}) or sorted({c["gpus_per_node"] for c in coll}),
        "alltoall": _fit_a2a(cs),
    }


def check_scale(h: dict[str, Any], nodes: int, gpn: int) -> None:
    """Refuse a projection the calibration's levels cannot price: several nodes when only one
    node was measured, or one node when only multi-node communicators were."""
    lv = h["levels"]
    if nodes > 1 and not lv["inter"]["measured_at"]:
        raise UsageError(f"{nodes} nodes: this calibration measured one node only (intra-node); "
                         "fit with records from 2 or more nodes to project across nodes")
    if nodes == 1 and not lv["intra"]["measured_at"] and gpn > 1:
        raise UsageError("1 node: this calibration measured multi-node communicators only; "
                         "add one-node records to project inside a node")


def is_nccl(records: Iterable[dict[str, Any]]) -> bool:
    """Records of an NCCL fabric: the backend NCCL (or unnamed, with an NCCL version in the
    fingerprint); Gloo's records keep Gloo's own form."""
    recs = list(records)
    backends = {str((r.get("fabric") or {}).get("backend") or "").lower() for r in recs}
    return bool(recs) and "gloo" not in backends and (backends <= {"nccl", ""}) and nccl_of(recs) is not None


def label(h: dict[str, Any], nodes: int, gpn: int) -> str:
    at = [tuple(a) for lv in h["levels"].values() for a in lv["measured_at"]]
    top = max(n for n, _ in at)
    if (nodes, gpn) in at:
        return "measured"
    if nodes <= top:
        return "interpolated"
    # the same rule as the other forms: nothing measured supports a node count past MODEL_ONLY x the largest
    return "extrapolated" if nodes <= MODEL_ONLY * top else "model-only"


def layouts(h: dict[str, Any], nodes: str | None, gpn: int | None, ranks: list[int] | None) -> list[tuple[int, int]]:
    """The (nodes, GPUs per node) to project: --nodes with --gpus-per-node, or --ranks alone when
    the calibration has one level (one node: ranks on it; multi-node: its one GPUs per node)."""
    if nodes:
        try:
            ns = [int(x) for x in nodes.replace(" ", "").split(",") if x]
        except ValueError:
            raise UsageError(f"--nodes {nodes!r}: give whole numbers separated by commas, e.g. --nodes 8,64") from None
        if not ns or min(ns) < 1:
            raise UsageError(f"--nodes {nodes!r}: every count must be 1 or more")
        g = gpn or (h["gpus_per_node"][0] if len(h["gpus_per_node"]) == 1 else None)
        if g is None:
            raise UsageError(f"--nodes {nodes}: add --gpus-per-node (measured: {', '.join(map(str, h['gpus_per_node']))})")
        out = [(n, g) for n in ns]
    else:
        lv = {k for k, v in h["levels"].items() if v["measured_at"]}
        if lv != {"intra"} and lv != {"inter"}:
            raise UsageError("this NCCL calibration has two levels (one node and several): give --nodes N "
                             "--gpus-per-node G, not --ranks")
        out = []
        for p in ranks or []:
            if lv == {"intra"}:
                out.append((1, p))
                continue
            (g,) = h["gpus_per_node"][:1] or [gpn]
            if p % g:
                raise UsageError(f"--ranks {p}: {g} GPUs per node do not divide {p} ranks; give --nodes N --gpus-per-node G")
            out.append((p // g, g))
    for n, g in out:
        check_scale(h, n, g)
    return out


def projection(cal: dict[str, Any], op: str, size: int, nodes: int, gpn: int) -> dict[str, Any]:
    h = cal["nccl"]
    pr = predict(op, size, nodes, gpn, cal)
    p = nodes * gpn
    g = 2 * (p - 1) / p if op == "all_reduce" else (p - 1) / p
    return pr | {"fabric": cal["fabric"], "op": op, "size": size, "nodes": nodes, "gpus_per_node": gpn, "p": p,
                 "busbw_GBps": size / pr["time_s"] * g / 1e9, "label": label(h, nodes, gpn), "nccl": h["version"]}


def projection_line(pr: dict[str, Any], name: str) -> str:
    how = "p2p, NVLink and network bytes apart" if pr["algo"] == "p2p" else f"{pr['algo']}/{pr['proto']}"
    return (f"{name} {pr['op']} {_size(pr['size'])} on {pr['nodes']} x {pr['gpus_per_node']} ({pr['p']} ranks): "
            f"{pr['time_s'] * 1e3:.3f} ms, busbw {pr['busbw_GBps']:.4g} GB/s; NCCL {pr['nccl']} {how}; {pr['label']} "
            "(NCCL's model through the fitted levels; no interval for this form yet)")


def compare_line(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> str:
    fast, slow = ((a, names[0]), (b, names[1])) if a["time_s"] <= b["time_s"] else ((b, names[1]), (a, names[0]))
    return (f"  on {a['nodes']} x {a['gpus_per_node']}, {a['op']} {_size(a['size'])}: {fast[1]} is faster than {slow[1]} "
            f"by {100 * (slow[0]['time_s'] / fast[0]['time_s'] - 1):.1f}% (NCCL's model, point estimates)")


def fit_lines(cal: dict[str, Any]) -> list[str]:
    h = cal["nccl"]
    m = h["measured"]
    out = [f"  NCCL {h['nccl']} (its {h['version']} cost model): fitted through NCCL's algorithm choice, "
           f"rms log error {100 * h['rms_log_error']:.1f}%; `model project`, `check` and `export` price this fabric "
           "by it, not by the ring terms above"]
    for name, bw, lat, what in (("intra", "intra_busbw", "intra_lat", "NVLink/PCI"), ("inter", "inter_busbw", "net_lat", "network")):
        at = h["levels"][name]["measured_at"]
        where = ", ".join(f"{n} x {g}" for n, g in at) if at else None
        line = (f"    {name}-node: bus bandwidth {m[bw]:.4g} GB/s, {m[lat]:.3g}x NCCL's {what} step latencies; "
                + (f"measured on {where}" if where else "not measured (NCCL's constants stand; projecting there is refused)"))
        if name == "inter" and at and cal.get("payload_GBps") and m[bw] > cal["payload_GBps"]:
            line += (f"; ABOVE the link's payload ceiling {cal['payload_GBps']:.4g} GB/s: the fit does not describe "
                     "this link (check the records' fabric)")
        out.append(line)
    a = h.get("alltoall")
    if a:
        out.append(f"    alltoall: {a['lat_s'] * 1e6:.2f} us per peer, NVLink {a['intra_GBps']:.4g} GB/s, network "
                   f"{a['inter_GBps']:.4g} GB/s per GPU")
    return out


def nccl_rows(nodes: int, gpn: int, nccl: str, m: nc.Measured, sizes: list[int], **shape: Any) -> list[dict[str, Any]]:
    """A collectives record's rows whose times are NCCL's own model's on nodes x gpn (the
    default topology or `shape`'s, `m` in NCCL's hardware's place): what a fabric NCCL describes
    exactly would measure, for checking a fit against NCCL's model."""
    t = base_topology(nodes, gpn, **shape)
    rows = []
    for op in NCCL_OPS:
        for s in sizes:
            us = nc.choose(t, op, s, nc.version_of(nccl), m).time_s * 1e6
            rows.append({"op": op, "size": s, "group_size": nodes * gpn, "in_place": {"time_us": us},
                         "out_of_place": {"time_us": us}})
    return rows


def project_step(cal: dict[str, Any], rec: dict[str, Any], nodes: int, gpn: int) -> dict[str, Any]:
    """A training record's step time on nodes x gpn from an NCCL calibration: the time with no
    collective in flight stays; the time with one in flight scales as the step's own traced calls
    priced by NCCL's model there over the same calls at the record's layout. A call on the whole
    world (data parallel all_reduce, ZeRO's all_gather/reduce_scatter, MoE's alltoall) moves to
    the new layout; a call on a group inside a node (tensor parallel) stays inside a node of its
    own size, priced at the intra level both times. No interval yet (this form has none)."""
    from analysis.projection.step import _TRACE_OPS, _call_size, training_inputs

    calls, m, p0, step, comm = training_inputs(cal, rec)
    n0, g0 = level_of(rec, p0)
    at = base = 0.0
    kinds: dict[str, float] = {}
    for one in calls:
        for name, dtype, numel, group, _start, _end in one:
            op = _TRACE_OPS.get(name)
            if op is None or not numel:
                continue
            g = int(group or p0)
            size = _call_size(op, numel, dtype, g)
            if g == p0:
                before, after = (predict(op, size, n0, g0, cal)["time_s"], predict(op, size, nodes, gpn, cal)["time_s"])
                kind = f"{op} on the world"
            elif g <= min(g0, gpn):
                before = after = predict(op, size, 1, g, cal)["time_s"]
                kind = f"{op} inside a node ({g} GPUs)"
            else:
                raise UsageError(f"the record's steps run {op} on groups of {g} ranks that span nodes of {g0}: "
                                 "price whole-world or inside-node groups only")
            at, base = at + after, base + before
            kinds[kind] = kinds.get(kind, 0.0) + after
    if base <= 0:
        raise UsageError("the record's trace holds no collective the model prices")
    comm_at = comm * at / base
    return {"nodes": nodes, "gpus_per_node": gpn, "p": nodes * gpn, "step_s": max(0.0, step - comm) + comm_at,
            "comm_s": comm_at, "measured_step_s": step, "measured_at": [n0, g0], "calls": kinds,
            "label": label(cal["nccl"], nodes, gpn)}


def step_line(sp: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sp["calls"].items())
    return (f"training step on {sp['nodes']} x {sp['gpus_per_node']} ({sp['p']} ranks): {sp['step_s'] * 1e3:.1f} ms "
            f"(communication {sp['comm_s'] * 1e3:.1f} ms of it; one step's calls by NCCL's model: {parts}) from "
            f"{sp['measured_step_s'] * 1e3:.1f} ms measured on {sp['measured_at'][0]} x {sp['measured_at'][1]}; "
            f"{sp['label']} (no interval for this form yet)")


def check_rows(cal: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`model check` on an NCCL calibration: per measured cell (op, nodes x GPUs per node, size)
    NCCL's model through the fitted levels beside the measurement (no interval for this form
    yet, so no inside/outside); a layout whose level was not measured is refused."""
    out = []
    for c in cells(records, [o for o in cal["ops"] if o in NCCL_OPS or (o == "alltoall" and cal["nccl"]["alltoall"])]):
        n, g = c["nodes"], c["gpus_per_node"]
        check_scale(cal["nccl"], n, g)
        pr = predict(c["op"], c["size"], n, g, cal)
        out.append({"op": c["op"], "p": n * g, "nodes": n, "gpus_per_node": g, "size": c["size"],
                    "measured_s": c["time_s"], "predicted_s": pr["time_s"], "algo": f"{pr['algo']}/{pr['proto']}",
                    "label": label(cal["nccl"], n, g), "abs_error": abs(c["time_s"] / pr["time_s"] - 1)})
    return out


def check_line(r: dict[str, Any]) -> str:
    return (f"{r['op']} {r['size']} B on {r['nodes']} x {r['gpus_per_node']}: measured {r['measured_s'] * 1e3:.3f} ms, "
            f"NCCL's model {r['predicted_s'] * 1e3:.3f} ms ({r['algo']}; {r['label']}), error {100 * r['abs_error']:.1f}%")


def check_summary(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no cell of these records is a collective the calibration has"
    return (f"{len(rows)} measured cells against NCCL's model through the fitted levels: median |error| "
            f"{100 * median(r['abs_error'] for r in rows):.1f}%, worst {100 * max(r['abs_error'] for r in rows):.1f}% "
            "(no interval for this form yet)")
