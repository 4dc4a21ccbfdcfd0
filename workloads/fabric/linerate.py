"""Line rate: what the rails a run uses could carry, per node and per communicator, and bandwidth as a share of it.

A node's line rate is the sum of its rails' rates (the rails `nic.rails_for` names: the
devices NCCL said it used, the interfaces Gloo bound, else what the profile selects):

    net:<iface>         /sys/class/net/<iface>/speed             Mbit/s (absent or -1 on lo, veth)
    rdma:<dev>:<port>   /sys/class/infiniband/<dev>/ports/<port>/rate   "200 Gb/sec (4X HDR)"

An emulated link (a profile with an `emulate:` block) reports its shaped rate instead: a
veth's own `speed` (10000) says nothing about the tc qdisc on it. tbf counts every frame
from its Ethernet header on (MTU + 14 bytes; no preamble or FCS on a veth), and a TCP
segment carries MTU − 52 bytes of payload (IP 20, TCP 20, timestamps 12), so the payload
ceiling of TCP over the link is rate × (MTU − 52) / (MTU + 14): 1448/1514 at MTU 1500,
100 Mbit/s → 0.01195 GB/s.

Per communicator: NCCL's inter-node ring hops once per node on each channel, so the bytes
a node puts on its rails equal what one of its ranks sends (busbw × t), and a communicator
that spans whole nodes (pattern `all`) is bounded by the node's NIC aggregate, not by the
aggregate / GPUs per node. NCCL's own model says the same: src/graph/tuning.cc (v2.30.7)
rates a ring at nChannels × bwInter, and src/graph/search.cc stops adding channels at
nChannels × bwInter >= the system's total NIC bandwidth; its maintainer: "DGX-1 can get
48 GB/s because we have 4 IB adapters" (NVIDIA/nccl-tests#29, 8 GPUs on 4 EDR ports).
Only where several communicators of one node cross the rails at the same time (patterns
`one_per_node` and `pairs`: one per local rank) does each get its share, the node rate /
those communicators. Over several nodes the slowest node bounds the job. GB/s = 1e9
bytes/s, as the busbw it is compared with.

A busbw above that bound on a multi-node run is impossible for a ring: NCCL
reduced part of the data elsewhere (NVLS in the NVLink switch, CollNet/SHARP in the
network switch) or Tree's traffic pattern moved less over the NICs. The cause is read from
NCCL's tuning lines (NCCL_DEBUG_SUBSYS=TUNING, printed by rank 0 for each collective):

    NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}   (2.24 .. 2.30, enqueue.cc:822)
    NCCL INFO AllReduce: 4194304 Bytes -> Algo 1 proto 2 time 512.000000                   (2.23, v2.23.4-1 enqueue.cc:1855)
    NCCL INFO 4194304 Bytes -> Algo 1 proto 2 time 512.000000                              (2.20 .. 2.22, v2.20.3-1 :1498)

and NCCL 2.19 and older log none (the INFO line is commented out, v2.19.4-1 enqueue.cc:1217),
which the cause then says.

(src/enqueue.cc; algorithm names from ncclAlgoToString in src/collectives.cc, numbers
from NCCL_ALGO_* in src/include/devcomm.h: 0 TREE, 1 RING, 2 COLLNET_DIRECT,
3 COLLNET_CHAIN, 4 NVLS, 5 NVLS_TREE, 6 PAT.)
"""

from __future__ import annotations

import re
from pathlib import Path

from workloads.fabric.preflight import sysfs_root

_IB_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_ALGO_NEW = re.compile(r"\b(?P<func>[A-Za-z]+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>[A-Z_]+|\d+) "
                       r"proto (?P<proto>[A-Z0-9_]+)")
_ALGO_OLD = re.compile(r"NCCL INFO (?P<bytes>\d+) Bytes -> Algo (?P<algo>\d+) proto (?P<proto>\d+) time")
ALGO_NUMBERS = {0: "TREE", 1: "RING", 2: "COLLNET_DIRECT", 3: "COLLNET_CHAIN", 4: "NVLS", 5: "NVLS_TREE", 6: "PAT"}
PROTO_NUMBERS = {0: "LL", 1: "LL128", 2: "SIMPLE"}
NCCL_FUNCS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
              "broadcast": "Broadcast", "reduce": "Reduce"}
# Why an algorithm can beat the ring's bound on the NICs.
CAUSES = {
    "NVLS": "NVLS (NVLink SHARP) reduces inside the NVLink switch, so less than a ring's share crosses the NICs",
    "NVLS_TREE": "NVLS_TREE reduces inside the NVLink switch and trees across nodes",
    "COLLNET_DIRECT": "CollNet (SHARP) reduces inside the network switch",
    "COLLNET_CHAIN": "CollNet (SHARP) reduces inside the network switch",
    "TREE": "Tree moves less data per rank over the NICs than busbw's ring formula assumes",
    "PAT": "PAT moves less data per rank over the NICs than busbw's ring formula assumes",
}
REMEDY = "measure the ring with NCCL_ALGO=Ring (fabric.env.NCCL_ALGO=Ring)"


def tcp_payload_fraction(mtu: int) -> float:
    """Share of a shaped veth's frame bytes that is TCP payload: (MTU − 52) / (MTU + 14)."""
    return (mtu - 52) / (mtu + 14)


def parse_ib_rate(text: str | None) -> float | None:
    """'200 Gb/sec (4X HDR)' -> 2e11 bit/s; None when sysfs says nothing usable."""
    m = _IB_RATE.match(text or "")
    return float(m.group(1)) * 1e9 if m else None


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:  # absent, or EINVAL (speed of lo or of a link that is down)
        return None


def rail_rate(rail: str, root=None) -> float | None:
    """bit/s of one rail (`net:<iface>` or `rdma:<dev>:<port>`) from sysfs; None if unknown."""
    base = sysfs_root(root) / "class"
    kind, _, name = rail.partition(":")
    if kind == "net":
        v = _read(base / "net" / name / "speed")
        return float(v) * 1e6 if v and v.lstrip("-").isdigit() and int(v) > 0 else None
    if kind == "rdma":
        dev, _, port = name.rpartition(":")
        return parse_ib_rate(_read(base / "infiniband" / dev / "ports" / port / "rate"))
    return None


def node_line_rate(rails: list[str], emulate: dict | None = None, root=None) -> dict:
    """This node's line rate over `rails`. Pure sysfs reads (or the profile's emulate block)."""
    if emulate is not None:
        from workloads.fabric.netns import rate_bits_per_s

        rate = emulate.get("rate")
        bits = rate_bits_per_s(str(rate)) if rate else None
        mtu = int(emulate.get("mtu") or 1500)
        shaping = f"tc {emulate.get('qdisc') or 'tbf'} rate {rate}" if rate else "unshaped veth: no rate"
        return {"source": f"emulated ({shaping})",
                "rails": {r: bits for r in rails}, "bits_per_s": bits if rails else None,
                "payload_bits_per_s": None if bits is None else bits * tcp_payload_fraction(mtu)}
    rates = {r: rail_rate(r, root) for r in rails}
    known = [v for v in rates.values() if v is not None]
    return {"source": "sysfs", "rails": rates, "bits_per_s": sum(known) if known else None,
            "unknown_rails": [r for r, v in rates.items() if v is None], "payload_bits_per_s": None}


def communicators_per_node(groups: list[list[int]], ranks_per_node: int) -> int:
    """How many of `groups` (communicators that run side by side) have a rank on one node and
    a rank on another, the busiest node counted: they share that node's rails. Ranks are
    numbered node by node (torchrun). `all` -> 1, `one_per_node`/`pairs` -> ranks per node."""
    rpn = max(1, ranks_per_node)
    per_node: dict[int, int] = {}
    for g in groups:
        nodes = {r // rpn for r in g}
        if len(nodes) > 1:
            for n in nodes:
                per_node[n] = per_node.get(n, 0) + 1
    return max(per_node.values(), default=1)


def job_line_rate(nodes: list[dict], ranks_per_node: int, comms_per_node: int = 1) -> dict:
    """Per node (as gathered) and the bound of one communicator's busbw across nodes: the
    slowest node's rate / the communicators that cross its rails at once
    (communicators_per_node), in GB/s (1e9 B/s) to compare with busbw."""
    rates = [n.get("bits_per_s") for n in nodes]
    known = [r for r in rates if r]
    node_bits = min(known) if known and len(known) == len(rates) else None
    payloads = [n.get("payload_bits_per_s") for n in nodes]
    payload = min(payloads) if payloads and all(payloads) else None
    share = max(1, comms_per_node)
    return {
        "nodes": nodes,
        "ranks_per_node": max(1, ranks_per_node),
        "comms_per_node": share,
        "per_node(GB/s)": None if node_bits is None else node_bits / 8e9,
        "per_comm(GB/s)": None if node_bits is None else node_bits / 8e9 / share,
        "payload_per_comm(GB/s)": None if payload is None else payload / 8e9 / share,
    }


def pct(value: float | None, rate: float | None) -> float | None:
    """value as a percentage of rate (both GB/s); None when either is unknown."""
    if value is None or not rate:
        return None
    return 100.0 * value / rate


# ---------------------------------------------------------------------------------------
# NCCL's algorithm choice, and the flag for busbw above the line rate


def parse_algorithms(text: str) -> list[dict]:
    """Every tuning line of one NCCL log: [{func, bytes, algo, proto}] (func None on the
    older form, which does not name the collective)."""
    out = []
    for line in text.splitlines():
        if (m := _ALGO_NEW.search(line)) is not None:
            algo, proto = m["algo"], m["proto"]   # 2.23 names the function but numbers the rest
            out.append({"func": m["func"], "bytes": int(m["bytes"]),
                        "algo": ALGO_NUMBERS.get(int(algo), algo) if algo.isdigit() else algo,
                        "proto": PROTO_NUMBERS.get(int(proto), proto) if proto.isdigit() else proto})
        elif (m := _ALGO_OLD.search(line)) is not None:
            out.append({"func": None, "bytes": int(m["bytes"]), "algo": ALGO_NUMBERS.get(int(m["algo"]), m["algo"]),
                        "proto": PROTO_NUMBERS.get(int(m["proto"]), m["proto"])})
    return out


def algorithms_in(log_dir: Path) -> list[dict]:
    """Tuning lines of every NCCL log in `log_dir` (rank 0's file holds them)."""
    d = Path(log_dir)
    if not d.is_dir():
        return []
    return [a for p in sorted(d.glob("*.log")) for a in parse_algorithms(p.read_text(errors="replace"))]


def version_in(log_dir: Path) -> tuple[int, ...] | None:
    """The NCCL version the logs in `log_dir` name ("NCCL version 2.19.3+cuda12.2"), or None."""
    from workloads.fabric.nccl_log import _VERSION

    d = Path(log_dir)
    for p in sorted(d.glob("*.log")) if d.is_dir() else []:
        for line in p.read_text(errors="replace").splitlines():
            if (m := _VERSION.search(line)) and m["lib"] == "NCCL":
                nums = re.match(r"(\d+)\.(\d+)\.(\d+)", m["ver"])
                if nums:
                    return tuple(int(x) for x in nums.groups())
    return None


def algorithms_for(op: str, size: int, group_size: int, algos: list[dict]) -> list[str]:
    """The algorithms NCCL chose for `op` at a row of `size` bytes: NCCL logs count × type
    size, the per-rank count for AllGather/ReduceScatter (size / n here), the buffer otherwise."""
    func = NCCL_FUNCS.get(op)
    want = {size, size // max(1, group_size)}
    mine = [a for a in algos if a["func"] in (func, None)]
    exact = sorted({a["algo"] for a in mine if a["bytes"] in want})
    return exact or sorted({a["algo"] for a in mine if a["func"] == func})


def above_line_rate(rows: list[dict], per_comm: float | None, nodes: int, algos: list[dict],
                    version: tuple[int, ...] | None = None) -> list[dict]:
    """One flag per op whose busbw exceeded one communicator's line rate (job_line_rate) on a
    multi-node run, with the likely cause from NCCL's algorithm choice and the way to measure
    the ring."""
    if per_comm is None or nodes < 2:
        return []
    flags: dict[str, dict] = {}
    for r in rows:
        for c in (r.get("out_of_place"), r.get("in_place")):
            if not c or c.get("busbw", 0) <= per_comm:
                continue
            f = flags.setdefault(r["op"], {"op": r["op"], "sizes": [], "max_busbw(GB/s)": 0.0, "algorithms": set()})
            if r["size"] not in f["sizes"]:
                f["sizes"].append(r["size"])
            f["max_busbw(GB/s)"] = max(f["max_busbw(GB/s)"], c["busbw"])
            f["algorithms"].update(algorithms_for(r["op"], r["size"], r["group_size"], algos))
    out = []
    for f in flags.values():
        algs = sorted(f["algorithms"])
        causes = [CAUSES[a] for a in algs if a in CAUSES]
        if causes:
            cause = f"NCCL chose {', '.join(algs)}: " + "; ".join(causes)
        elif algs:
            cause = (f"NCCL chose {', '.join(algs)}, which cannot beat the line rate: check the rails counted "
                     "(a NIC missing from them) and the rate sysfs reports")
        elif version is not None and version < (2, 20, 0):
            cause = (f"NCCL {'.'.join(map(str, version))} logs no per-call algorithm (2.20 and later do, with "
                     "NCCL_DEBUG_SUBSYS=TUNING), so which one ran is unknown; NVLS, Tree or CollNet are the usual "
                     "reasons")
        else:
            cause = ("no NCCL tuning lines in the log (NCCL_DEBUG_SUBSYS needs TUNING) to tell which algorithm ran; "
                     "NVLS, Tree or CollNet are the usual reasons")
        pct_max = pct(f["max_busbw(GB/s)"], per_comm)
        out.append({"op": f["op"], "sizes": f["sizes"], "max_busbw(GB/s)": f["max_busbw(GB/s)"],
                    "algorithms": algs, "cause": cause, "remedy": REMEDY,
                    "message": f"{f['op']} busbw {f['max_busbw(GB/s)']:g} GB/s is {pct_max:.0f}% of the line rate "
                               f"{per_comm:g} GB/s per communicator across nodes: {cause}; {REMEDY}"})
    return out


def describe(job: dict) -> str:
    """One line for the printed summary."""
    per_comm = job.get("per_comm(GB/s)")
    if per_comm is None:
        unknown = sorted({r for n in job["nodes"] for r, v in (n.get("rails") or {}).items() if v is None})
        why = (f"no rate for {', '.join(unknown)} in sysfs or the emulate block" if unknown
               else "no rails found for this fabric")
        return f"line rate unknown ({why}): % of line rate is n/a"
    node = job["nodes"][0]
    rails = ", ".join(node.get("rails") or {}) or "no rails"
    share = job.get("comms_per_node", 1)
    line = (f"line rate {per_comm:g} GB/s per communicator = {job['per_node(GB/s)']:g} GB/s per node ({rails}; "
            f"{node.get('source')}) / {share} communicator(s) per node crossing its rails")
    if job.get("payload_per_comm(GB/s)"):
        line += f"; TCP payload ceiling {job['payload_per_comm(GB/s)']:.5g} GB/s"
    return line
