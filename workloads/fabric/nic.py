"""NIC counters around the timed steps: bytes per rail and per step, link throughput, fairness.

Rails are named `net:<iface>` (from /sys/class/net/<iface>/statistics/{tx,rx}_bytes) and
`rdma:<dev>:<port>` (from /sys/class/infiniband/<dev>/ports/<port>/counters/
port_{xmit,rcv}_data, which count 4-byte words: bytes = value × 4). Counters are per host,
so they include every process's traffic on that rail, and headers (Ethernet/IP/TCP or
IB/RoCE) on top of payload. On `lo` a byte sent is counted once in tx_bytes and once in
rx_bytes of the same interface.

Each timed step is bracketed (`begin_step`/`end_step`): a step's bytes are the counter
difference across it, so traffic between steps (verification, logging) is left out. On the
host itself the network rails come from one read of /proc/net/dev, where the kernel fills each
interface's tx and rx from one statistics call, so a pair is one instant: read from sysfs as two
files, a reader preempted between them let 861 KB of other jobs' loopback traffic into one
step's tx and not its rx (lo counts a byte in both at once). A fake sysfs tree (`root`, or
$FABRICBENCH_SYSFS_ROOT, for tests) is read file by file. RDMA ports are read from sysfs
(1.6 ms for 4 interfaces on a loaded 2-core CI box); all of it outside the timed window:
begin_step before the step clock starts, end_step after it stops.

Jain's fairness index over the rails the profile uses, J = (Σx)² / (n·Σx²) with x the
bytes (tx + rx) each rail moved: 1 when traffic spread evenly over n rails, 1/n when one
rail carried everything.

Every node: the local-rank-0 process of each node samples its own host's counters and
rank 0 gathers them (`gather_summaries`); `jain_index` is then taken over every rail of
every node, `jain_index_per_node` within each. Congestion counters are read once at the
first step and once at the summary, where the host has them: RDMA `hw_counters`
(np_cnp_sent: CNPs this port sent as a notification point; rp_cnp_handled: CNPs it
reacted to as a reaction point; out_of_buffer: packets dropped for lack of a receive
buffer) and pause-frame counters of `ethtool -S` on physical interfaces (every counter
whose name holds "pause", e.g. mlx5's rx_prio3_pause, tx_pause_ctrl_phy); absent tools,
drivers or counters are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from workloads.core import timeline
from workloads.fabric.preflight import SYSFS_ENV, sysfs_root

Counters = dict[str, tuple[int, int]]  # rail -> (tx bytes, rx bytes)


def _int(p) -> int | None:
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return None


def parse_proc_net_dev(text: str) -> Counters:
    """`net:<iface>` -> (tx bytes, rx bytes) from /proc/net/dev (the kernel's dev_seq_printf_stats:
    after "<iface>:", 8 receive fields from bytes, then 8 transmit fields from bytes)."""
    out: Counters = {}
    for line in text.splitlines()[2:]:
        name, sep, fields = line.partition(":")
        values = fields.split()
        if sep and len(values) >= 16:
            out[f"net:{name.strip()}"] = (int(values[8]), int(values[0]))
    return dict(sorted(out.items()))


def read_counters(root=None) -> Counters:
    base = sysfs_root(root) / "class"
    out: Counters = {}
    net = base / "net"
    if root is None and not os.environ.get(SYSFS_ENV):
        try:
            out.update(parse_proc_net_dev(Path("/proc/net/dev").read_text()))
        except OSError:
            pass
    if not out and net.is_dir():
        for d in sorted(net.iterdir()):
            tx, rx = _int(d / "statistics" / "tx_bytes"), _int(d / "statistics" / "rx_bytes")
            if tx is not None and rx is not None:
                out[f"net:{d.name}"] = (tx, rx)
    ib = base / "infiniband"
    if ib.is_dir():
        for dev in sorted(ib.iterdir()):
            for port in sorted((dev / "ports").glob("*")):
                c = port / "counters"
                tx, rx = _int(c / "port_xmit_data"), _int(c / "port_rcv_data")
                if tx is not None and rx is not None:
                    out[f"rdma:{dev.name}:{port.name}"] = (4 * tx, 4 * rx)  # 4-byte words -> bytes
    return out


# ports/<p>/hw_counters/<name>, as the mlx5 driver names them (prometheus/procfs class_infiniband.go
# lists the same files): ECN-marked RoCE packets seen and CNPs sent as a notification point,
# CNPs handled or ignored as a reaction point, receive-buffer drops
CONGESTION = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored", "out_of_buffer")


def read_congestion(root=None) -> dict[str, dict[str, int]]:
    """rail -> {counter: value} for every RDMA port whose driver exposes hw_counters."""
    out: dict[str, dict[str, int]] = {}
    ib = sysfs_root(root) / "class" / "infiniband"
    if not ib.is_dir():
        return out
    for dev in sorted(ib.iterdir()):
        for port in sorted((dev / "ports").glob("*")):
            vals = {n: v for n in CONGESTION if (v := _int(port / "hw_counters" / n)) is not None}
            if vals:
                out[f"rdma:{dev.name}:{port.name}"] = vals
    return out


def parse_ethtool_pause(text: str) -> dict[str, int]:
    """The pause-frame counters of one `ethtool -S <iface>` output ("     rx_prio3_pause: 12")."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep and "pause" in name and value.strip().isdigit():
            out[name.strip()] = int(value)
    return out


def read_pause(root=None) -> tuple[dict[str, dict[str, int]], str | None]:
    """iface -> pause counters for every physical interface (one with a `device` link in
    sysfs: no lo, veth or bridge); (empty, why) when there is nothing to read."""
    net = sysfs_root(root) / "class" / "net"
    phys = sorted(d.name for d in net.iterdir() if (d / "device").exists()) if net.is_dir() else []
    if not phys:
        return {}, "no physical interface (lo, veth and bridges have no pause counters)"
    if shutil.which("ethtool") is None:
        return {}, "ethtool is not installed"
    out = {}
    for iface in phys:
        try:
            p = subprocess.run(["ethtool", "-S", iface], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if p.returncode == 0 and (found := parse_ethtool_pause(p.stdout)):
            out[f"net:{iface}"] = found
    return out, None if out else "no pause counters in ethtool -S of " + ", ".join(phys)


def _delta(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict[str, dict[str, int | None]]:
    return {r: {k: (v - a[r][k] if k in a.get(r, {}) and v >= a[r][k] else None) for k, v in vals.items()}
            for r, vals in b.items() if r in a}


def jain_index(xs: list[float]) -> float | None:
    """(Σx)² / (n·Σx²); None when there is nothing to compare (no rails, no traffic)."""
    sq = sum(x * x for x in xs)
    if not xs or sq == 0:
        return None
    return sum(xs) ** 2 / (len(xs) * sq)


def summarize(steps: list[tuple[float, Counters, float, Counters]], rails: list[str]) -> dict:
    """Pure: `steps` holds (t_begin_s, counters, t_end_s, counters) per timed step."""
    window = sum(t1 - t0 for t0, _, t1, _ in steps)
    names = sorted({r for _, c0, _, c1 in steps for r in c0.keys() & c1.keys()})
    per_step: dict[str, dict[str, list[int | None]]] = {}
    per_rail: dict[str, dict] = {}
    for r in names:
        tx, rx = [], []
        for _, c0, _, c1 in steps:
            a, b = c0.get(r), c1.get(r)
            # A negative difference: a counter reset, or an old HCA's 32-bit counter that saturated.
            tx.append(b[0] - a[0] if a and b and b[0] >= a[0] else None)
            rx.append(b[1] - a[1] if a and b and b[1] >= a[1] else None)
        ttx, trx = sum(x for x in tx if x is not None), sum(x for x in rx if x is not None)
        if r in rails or ttx or trx:
            per_rail[r] = {
                "tx_bytes": ttx, "rx_bytes": trx,
                "tx_gbit_per_s": ttx * 8 / window / 1e9 if window > 0 else None,
                "rx_gbit_per_s": trx * 8 / window / 1e9 if window > 0 else None,
            }
        if r in rails:
            per_step[r] = {"tx_bytes": tx, "rx_bytes": rx}
    used = [r for r in rails if r in per_rail]
    return {
        "rails": used,
        "steps": len(steps),
        "window_s": window,
        "per_rail": per_rail,
        "per_step": per_step,
        "jain_index": jain_index([per_rail[r]["tx_bytes"] + per_rail[r]["rx_bytes"] for r in used]),
    }


@dataclass
class NicSampler:
    root: str | None = None
    steps: list = field(default_factory=list)
    _open: tuple | None = None
    enabled: bool = True  # false on every process but a node's local rank 0: one reader per host
    _extra: tuple | None = None  # (congestion, pause, pause skip reason) at the first step

    def begin_step(self) -> None:
        if not self.enabled:
            return
        if self._extra is None:
            self._extra = (read_congestion(self.root), *read_pause(self.root))
        c = read_counters(self.root)
        self._open = (time.perf_counter(), c)

    def end_step(self) -> None:
        if not self.enabled:
            return
        c = read_counters(self.root)
        t = time.perf_counter()
        if self._open is not None:
            self.steps.append((*self._open, t, c))
            self._open = None

    def summary(self, rails: list[str], rates: dict[str, float | None] | None = None,
                comm_window_s: float | None = None) -> dict:
        """`rates`: bit/s per rail (linerate.node_line_rate) for the % of line rate;
        `comm_window_s`: the time collectives were in flight, for the rate while they were."""
        if self.steps:  # the record's timeline: its measured window on the wall clock
            wall = time.time() - time.perf_counter()
            timeline.window(self.steps[0][0] + wall, self.steps[-1][2] + wall)
        out = summarize(self.steps, rails)
        out["host"] = socket.gethostname()
        out["scope"] = "host-wide counters: every process's traffic on these rails, headers included"
        add_line_rate(out, rates or {}, comm_window_s)
        if self._extra is not None:
            cong0, pause0, why = self._extra
            out["congestion"] = _delta(cong0, read_congestion(self.root))
            out["pause"] = _delta(pause0, read_pause(self.root)[0]) if not why else {}
            out["pause_skipped"] = why
        return out


def add_line_rate(summary: dict, rates: dict[str, float | None], comm_window_s: float | None) -> None:
    """Per rail: its line rate (Gbit/s), tx/rx throughput as % of it over the timed window
    and, given the comm window, tx throughput while collectives were in flight and its %."""
    for rail, v in summary["per_rail"].items():
        bits = rates.get(rail)
        v["line_rate(Gbit/s)"] = None if bits is None else bits / 1e9
        for d in ("tx", "rx"):
            g = v.get(f"{d}_gbit_per_s")
            v[f"{d}_pct_line"] = None if g is None or not bits else 100 * g * 1e9 / bits
        if comm_window_s:
            g = v["tx_bytes"] * 8 / comm_window_s / 1e9
            v["comm_tx_gbit_per_s"] = g
            v["comm_tx_pct_line"] = None if not bits else 100 * g * 1e9 / bits


def rails_for(profile, env, transport: dict | None, root=None) -> list[str]:
    """The rails this run's traffic should use: the devices NCCL said it used, the
    interfaces Gloo bound, else what the profile's env selects."""
    from workloads.fabric import preflight

    s = (transport or {}).get("summary") or {}
    if s.get("backend") == "gloo" and s.get("interfaces"):
        return [f"net:{i}" for i in s["interfaces"] if i != "?"]
    rails = []
    for d in s.get("devices") or []:
        if d.get("port") is not None:
            # a merged virtual NIC (NCCL_IB_MERGE_NICS) is named mlx5_0+mlx5_1; a Data Direct
            # device mlx5_0_dma (net_ib/init.cc) is mlx5_0's own port seen through another path
            for name in d["name"].split("+"):
                rail = f"rdma:{name.removesuffix('_dma')}:{d['port']}"
                if rail not in rails:
                    rails.append(rail)
        else:
            rails.append(f"net:{d['name']}")
    if rails:
        return rails
    if profile.backend == "gloo":
        names = [n.strip() for n in (env.get("GLOO_SOCKET_IFNAME") or "").split(",") if n.strip()]
        return [f"net:{n}" for n in names]
    if str((profile.expect or {}).get("network") or "").startswith("IB"):
        ports = preflight.select_ports(env.get("NCCL_IB_HCA"), preflight.rdma_ports(root))
        return [f"rdma:{p.label}" for p in ports if p.state == "ACTIVE"]
    if env.get("NCCL_SOCKET_IFNAME"):
        nl = preflight.NameList.parse(env["NCCL_SOCKET_IFNAME"])
        return [f"net:{i.name}" for i in preflight.net_ifaces(root) if nl.matches(i.name) and i.up]
    return []


def combine_nodes(nodes: list[dict]) -> dict:
    """Node 0's summary (the record's `nic` block as on one node) plus every node's, and
    Jain's index over all rails of all nodes and within each node."""
    out = dict(nodes[0])
    out["nodes"] = [dict(n, node=i) for i, n in enumerate(nodes)]
    moved = [v["tx_bytes"] + v["rx_bytes"] for n in nodes for r, v in n["per_rail"].items() if r in n["rails"]]
    out["jain_index"] = jain_index(moved)
    out["jain_index_per_node"] = [n["jain_index"] for n in nodes]
    out["rails_all_nodes"] = sum(len(n["rails"]) for n in nodes)
    return out


def gather_summaries(sampler: NicSampler, rails: list[str], rates: dict, info,
                     comm_window_s: float | None = None) -> dict | None:
    """Each node's local rank 0 summarises its host; rank 0 gets the combined block."""
    mine = sampler.summary(rails, rates, comm_window_s) if info.local_rank == 0 else None
    nodes = gather_from_nodes(mine, info)
    return None if nodes is None else combine_nodes(nodes)


def summary_rows(nic: dict | None) -> list[tuple[str, str]]:
    """One line per rail of every node: throughput, % of its line rate, the same while
    collectives were in flight; then Jain's index over all of them."""
    if not nic or not nic.get("nodes"):
        return []
    rows = []
    for n in nic["nodes"]:
        for rail in n["rails"]:
            v = n["per_rail"][rail]
            pct = "" if v.get("tx_pct_line") is None else f" = {v['tx_pct_line']:.1f}% of {v['line_rate(Gbit/s)']:g}"
            comm = "" if v.get("comm_tx_pct_line") is None else f", {v['comm_tx_pct_line']:.1f}% while communicating"
            rows.append((f"NIC node {n['node']}", f"{rail} tx {v['tx_gbit_per_s'] or 0:.4g} Gbit/s{pct}{comm}"))
    j = nic.get("jain_index")
    rows.append(("NIC fairness", "n/a" if j is None else f"Jain {j:.3f} over {nic['rails_all_nodes']} rail(s) of "
                                                         f"{len(nic['nodes'])} node(s)"))
    return rows


def gather_from_nodes(value, info) -> list | None:
    """Every node's `value` as its local-rank-0 process gives it, in node order, on rank 0
    (None on the other ranks). One all_gather_object over the world: small, once per run."""
    import torch.distributed as dist

    if info.world_size == 1 or not dist.is_initialized():
        return [value]
    got: list = [None] * info.world_size
    dist.all_gather_object(got, (info.local_rank, value))
    return [v for local_rank, v in got if local_rank == 0] if info.is_main else None
