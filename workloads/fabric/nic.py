"""NIC counters around the timed steps: bytes per rail and per step, link throughput, fairness.

Rails are named `net:<iface>` (from /sys/class/net/<iface>/statistics/{tx,rx}_bytes) and
`rdma:<dev>:<port>` (from /sys/class/infiniband/<dev>/ports/<port>/counters/
port_{xmit,rcv}_data, which count 4-byte words: bytes = value × 4). Counters are per host,
so they include every process's traffic on that rail, and headers (Ethernet/IP/TCP or
IB/RoCE) on top of payload. On `lo` a byte sent is counted once in tx_bytes and once in
rx_bytes of the same interface.

Each timed step is bracketed (`begin_step`/`end_step`): a step's bytes are the counter
difference across it, so traffic between steps (verification, logging) is left out.
Reading them is two sysfs reads per rail (1.6 ms for 4 interfaces on a loaded 2-core CI box),
done outside the timed window: begin_step before the step clock starts, end_step after it stops.

Jain's fairness index over the rails the profile uses, J = (Σx)² / (n·Σx²) with x the
bytes (tx + rx) each rail moved: 1 when traffic spread evenly over n rails, 1/n when one
rail carried everything.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from workloads.fabric.preflight import sysfs_root

Counters = dict[str, tuple[int, int]]  # rail -> (tx bytes, rx bytes)


def _int(p) -> int | None:
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return None


def read_counters(root=None) -> Counters:
    base = sysfs_root(root) / "class"
    out: Counters = {}
    net = base / "net"
    if net.is_dir():
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

    def begin_step(self) -> None:
        c = read_counters(self.root)
        self._open = (time.perf_counter(), c)

    def end_step(self) -> None:
        c = read_counters(self.root)
        t = time.perf_counter()
        if self._open is not None:
            self.steps.append((*self._open, t, c))
            self._open = None

    def summary(self, rails: list[str]) -> dict:
        out = summarize(self.steps, rails)
        out["host"] = socket.gethostname()
        out["scope"] = "host-wide counters: every process's traffic on these rails, headers included"
        return out


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
