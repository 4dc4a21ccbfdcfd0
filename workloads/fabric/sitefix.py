"""The site settings a node's own inventory suggests for a fabric profile, ready to paste into
conf/local/<fabric>.yaml (docs/fabrics.md), and a diff of several nodes' inventories.

Read-only, from sysfs (workloads/fabric/preflight.py's readers) and /proc/net/route: the active
ports of the link layer the profile expects, the RoCE v2 GID index every such port has, the
interface of the default route for NCCL's and Gloo's bootstrap, each HCA's NUMA node, and the
congestion counters of the lossless queue (CNPs, ECN marks) where the driver exposes them.
`fabricbench doctor fabric=roce` prints them; `fabricbench doctor --compare a.json b.json` diffs nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from workloads.fabric import preflight

# mlx5's per-port RoCE congestion counters in sysfs (hw_counters/): CNPs this port sent as the
# notification point, CNPs it handled as the reaction point, packets that arrived ECN-marked.
# They move when the lossless queue's ECN marking reaches the NICs (the traffic class is right).
CONGESTION = ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets")


@dataclass(frozen=True)
class Suggestion:
    fabric: str
    env: dict[str, str]           # what conf/local/<fabric>.yaml should set
    notes: list[str]              # why, and what could not be suggested

    def yaml(self) -> str:
        """The site file's text, with a comment per note."""
        lines = ["env:", *(f'  {k}: "{v}"' for k, v in self.env.items())]
        return "\n".join([*lines, *(f"# {n}" for n in self.notes)]) + "\n"


def default_route_iface(proc: str | os.PathLike = "/proc") -> str | None:
    """The interface of the IPv4 default route (destination and mask 0) with the lowest metric.
    /proc/net/route: a header, then Iface, Destination, Gateway, Flags, RefCnt, Use, Metric, Mask, ...
    as hex words (Linux net/ipv4/fib_trie.c, fib_route_seq_show)."""
    try:
        rows = Path(proc, "net", "route").read_text().splitlines()[1:]
    except OSError:
        return None
    best = None
    for row in rows:
        f = row.split()
        if len(f) >= 8 and f[1] == "00000000" and f[7] == "00000000" and int(f[3], 16) & 0x1:  # RTF_UP
            metric = int(f[6])
            if best is None or metric < best[0]:
                best = (metric, f[0])
    return best[1] if best else None


def numa_node(root, device: str) -> int | None:
    value = preflight._read(preflight.sysfs_root(root) / "class" / "infiniband" / device / "device" / "numa_node")
    return int(value) if value and value.lstrip("-").isdigit() and int(value) >= 0 else None


def device_facts(root=None) -> dict[str, dict]:
    """Per RDMA device: firmware version and NUMA node (None where sysfs has none)."""
    base = preflight.sysfs_root(root) / "class" / "infiniband"
    if not base.is_dir():
        return {}
    return {d.name: {"fw_ver": preflight._read(d / "fw_ver"), "numa_node": numa_node(root, d.name)}
            for d in sorted(base.iterdir())}


def counters(root, port: preflight.RdmaPort) -> dict[str, int]:
    base = preflight.sysfs_root(root) / "class" / "infiniband" / port.device / "ports" / str(port.port) / "hw_counters"
    out = {}
    for name in CONGESTION:
        value = preflight._read(base / name)
        if value is not None and value.isdigit():
            out[name] = int(value)
    return out


def _hca_list(ports: list[preflight.RdmaPort], every: list[preflight.RdmaPort]) -> str:
    """NCCL's exact list (`=`) of the ports: a device alone when NCCL would take no other port of it."""
    entries = []
    for p in ports:
        others = [q for q in every if q.device == p.device and q.port != p.port]
        entries.append(p.label if others else p.device)
    return "=" + ",".join(entries)


def _gid_index(ports: list[preflight.RdmaPort]) -> tuple[int | None, list[str]]:
    """The RoCE v2 GID index every port has (an IPv4-mapped one first: NCCL's bootstrap speaks IPv4
    where the site does), and a note per port."""
    per = {p.label: [g for g in p.gids if g.is_roce_v2] for p in ports}
    notes = ["RoCE v2 GIDs: " + "; ".join(f"{label} {', '.join(str(g.index) for g in gs) or 'none'}"
                                            for label, gs in per.items())]
    common = set.intersection(*({g.index for g in gs} for gs in per.values())) if per else set()
    if not common:
        return None, notes + ["no RoCE v2 GID index is common to every port: give each port an address, or leave "
                              "NCCL_IB_GID_INDEX unset (NCCL 2.21+ picks a RoCE v2 GID per port)"]
    v4 = [i for i in sorted(common) if all(next(g for g in per[p] if g.index == i).gid.startswith(
        "0000:0000:0000:0000:0000:ffff:") for p in per)]
    return (v4 or sorted(common))[0], notes


def suggest(profile, root=None, proc: str | os.PathLike = "/proc") -> Suggestion | None:
    """The site settings this node suggests for `profile`; None for a profile that names no NCCL
    network (loopback, pcie, emulated fabrics)."""
    expect = (profile.expect or {}).get("link_layer")
    env, notes = {}, []
    if preflight.uses_ib(profile, preflight.effective_env(profile.env, {})) and expect:
        every = preflight.rdma_ports(root)
        ports = [p for p in every if p.state == "ACTIVE" and p.nccl_link_layer == expect]
        if not ports:
            return Suggestion(profile.name, {}, [f"no ACTIVE {expect} port on this node: nothing to suggest "
                                                  f"(present: {preflight._present_ports(every)})"])
        env["NCCL_IB_HCA"] = _hca_list(ports, every)
        left = [p.label for p in every if p not in ports and p.nccl_link_layer == expect]
        if left:
            notes.append(f"left out: {', '.join(left)} (not ACTIVE)")
        if expect == "RoCE":
            index, why = _gid_index(ports)
            notes += why
            if index is not None:
                env["NCCL_IB_GID_INDEX"] = str(index)
            if profile.env.get("NCCL_IB_TC"):
                notes.append(f"NCCL_IB_TC: the profile's {profile.env['NCCL_IB_TC']} kept; it must be the traffic "
                             "class of the switches' lossless (PFC/ECN) queue, which no node shows: ask the network team")
            for p in ports:
                c = counters(root, p)
                notes.append(f"{p.label} congestion counters: " + (", ".join(f"{k} {v}" for k, v in c.items()) if c else
                             "none in sysfs") + " (they move under load when NCCL_IB_TC is the lossless queue's class; "
                             f"pause frames: ethtool -S {preflight._ndev(p)} | grep pause)")
        numa = {p.device: numa_node(root, p.device) for p in ports}
        if any(n is not None for n in numa.values()):
            notes.append("NUMA node per HCA: " + ", ".join(f"{d} {n if n is not None else '?'}" for d, n in numa.items())
                         + " (a GPU's NIC is the one on its PCIe switch: nvidia-smi topo -m, PIX/PXB)")
    if profile.backend == "nccl" or "GLOO_SOCKET_IFNAME" in profile.env:
        iface = default_route_iface(proc)
        if iface:
            if profile.backend == "nccl":
                env["NCCL_SOCKET_IFNAME"] = f"={iface}"
            env["GLOO_SOCKET_IFNAME"] = iface
            notes.append(f"bootstrap: {iface}, the default route's interface")
        else:
            notes.append(f"bootstrap: no default route in {Path(proc, 'net', 'route')}; name the interface the nodes "
                         "reach each other on")
    if not env and not notes:
        return None
    return Suggestion(profile.name, env, notes)


def compare(inventories: dict[str, dict]) -> list[str]:
    """One line per fact that differs between the nodes' `doctor --json` inventories: firmware,
    ports (state, link layer, rate), the RoCE v2 GID indexes of each port, NCCL's version."""
    facts: dict[str, dict[str, str]] = {}
    for node, inv in inventories.items():
        for dev, f in (inv.get("devices") or {}).items():
            facts.setdefault(f"{dev} firmware", {})[node] = str(f.get("fw_ver"))
        for p in inv.get("rdma") or []:
            label = p.get("label")
            facts.setdefault(f"{label} port", {})[node] = f"{p.get('state')} {p.get('link_layer')} {p.get('rate')}"
            v2 = [str(g["index"]) for g in p.get("gids") or [] if str(g.get("type") or "").lower() == "roce v2"]
            if p.get("link_layer") == "Ethernet":
                facts.setdefault(f"{label} RoCE v2 GIDs", {})[node] = ", ".join(v2) or "none"
        n = inv.get("nccl") or {}
        facts.setdefault("NCCL", {})[node] = f"{n.get('library')} {n.get('version')}"
    out = []
    for what, by in facts.items():
        values = {node: by.get(node, "absent") for node in inventories}
        if len(set(values.values())) > 1:
            out.append(f"{what}: " + "; ".join(f"{node} {v}" for node, v in values.items()))
    return out
