"""The emulated fabric itself: network namespaces as nodes, veths, bridges, routers and shaped
links (needs root). The command that runs workloads on it is workloads/commands/emulate.py;
adapters, the line-rate code and the study read only this half (a rate, a spec, the nodes).

N namespaces ("nodes") joined by veth pairs — directly for N = 2, through a bridge in its own
namespace for N > 2, or through leaf and spine routers (workloads/fabric/leafspine.py) — each
node's link shaped on egress with `tc ... tbf rate R` (or an `htb` class). A link with a
one-way delay is spliced through a delay line (workloads/fabric/delayline.py): both veths end in
one "delay" namespace, where one process holds every frame for the delay before passing it on,
so rate (tbf, on the nodes' egress) and delay compose and are set apart, on kernels without
netem. The spec comes from a fabric profile's `emulate:` block:

    emulate: {nodes: 2, rate: 100mbit, qdisc: tbf, burst: null, latency: 2ms, mtu: 1500}

Everything is built with argv lists (no shell); namespaces are named fb-<pid>-<i> and removed
by `Topology.__exit__` — also after a failure — which removes their veths and qdiscs with them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from workloads.core.celllock import die_with_parent
from workloads.core.errors import Fault, UsageError
from workloads.fabric import leafspine
from workloads.fabric.delaymeter import DELAY_ENV

IFNAME = "emu0"          # the node's veth inside every namespace; GLOO_SOCKET_IFNAME of emu-*
SUBNET = "10.77.0"       # private to our namespaces: nothing outside them sees it
PREFIX = "fb-"           # every namespace we create: fb-<pid>-<suffix>
HOST_IFNAME = "emuh"     # node 0's end of the unshaped link from the host (served inference)
HOST_SUBNET = "10.78"    # a /30 of it per run, for that link
# Set for the load generator of an emulated inference run: the namespaces (comma-separated)
# that the server's ranks must run in, one torchrun agent each (see serve_agents).
NODES_ENV = "FABRICBENCH_EMULATED_NODES"
# Held (flock) from looking for a free /30 of HOST_SUBNET until ours is on our host end: two
# emulations starting at once (two test workers, two users) would otherwise both see the same
# /30 free and both take it. Everything else an emulation names is its own: namespaces carry
# the emulator's pid, node addresses live inside them, the host end is fbh-<tag>.
HOST_LINK_LOCK = Path("/run/lock/fabricbench-host-link.lock")
NETNS_ETC = Path("/etc/netns")  # per-namespace files that `ip netns exec` mounts over /etc (ip-netns(8))
# tc's rate syntax: a number and a unit (bit/s or bytes/s); see tc(8) "PARAMETERS".
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$", re.I)
_UNIT_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_TIME = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_TIME_US = {"us": 1.0, "ms": 1e3, "s": 1e6}
MAX_DELAY_US = 1e6       # the delay line's histogram ends at 1 s; no fabric is slower than that one way


# What tc can shape here: below 1 kbit/s tbf's rate rounds to nothing ("the rate parameter is
# mandatory" for 1bit) and no run finishes; above 1 Tbit/s the 4 ms burst passes tbf's 32-bit
# byte limit (100tbit: "illegal value for burst"), far beyond what a veth moves anyway.
RATE_RANGE = (1e3, 1e12)


def rate_bits_per_s(rate: str) -> float:
    """'100mbit' -> 1e8. tc's units are decimal (1mbit = 1e6 bit/s); 'mbps' is bytes/s."""
    m = _RATE.match(str(rate).strip())
    if not m:
        raise UsageError(f"emulate.rate={rate!r} is not a tc rate; use e.g. 100mbit, 1gbit or 10gbit (or null = unshaped)")
    bits = float(m.group(1)) * _UNIT_BITS[m.group(2).lower()]
    if not RATE_RANGE[0] <= bits <= RATE_RANGE[1]:
        raise UsageError(f"rate {rate} is outside what tc's tbf can shape here (1kbit to 1tbit); use e.g. 100mbit "
                         "or 10gbit (or null = unshaped)")
    return bits


def delay_us(value: Any, key: str = "emulate.latency") -> float:
    """'2ms' -> 2000.0 (one-way, µs); a bare 0 is no delay in any unit. UsageError, naming `key`
    (the override or the option the value came from), for anything else, negative or over 1 s
    included."""
    text = str(value).strip()
    if text in ("0", "0.0"):
        return 0.0
    if re.fullmatch(r"\d+(?:\.\d+)?ns", text):
        raise UsageError(f"{key}={value}: the delay line counts microseconds, not nanoseconds; use e.g. 1us, 500us "
                         "or 2ms (one way per link), or 0 for none")
    m = _TIME.match(text)
    if not m:
        raise UsageError(f"{key}={value!r} is not a delay; use e.g. 500us, 2ms or 0 (one way per link)"
                         + (", or null for no delay line" if key.startswith("emulate.") else ""))
    us = float(m.group(1)) * _TIME_US[m.group(2)]
    if us > MAX_DELAY_US:
        raise UsageError(f"{key}={value} is over the delay line's 1 s; use at most 1s")
    return us


class TopologyError(Fault, RuntimeError):
    """A command that builds the emulated fabric failed (ip, tc, sysctl): said in one line, exit 1."""

    def line(self) -> str:
        return f"error: could not build the emulated fabric: {self}"


@dataclass(frozen=True)
class EmuSpec:
    nodes: int = 2
    rate: str | None = None          # None: the veth is not shaped
    qdisc: str = "tbf"               # tbf | htb
    burst: int | None = None         # bytes; None = max(128 KiB, 4 ms at the rate)
    latency: str | None = None       # one-way delay of each node's link, e.g. "2ms" (a delay line); None: none
    mtu: int = 1500
    # How the nodes are joined: None = a veth pair for 2 nodes, a bridge (star) for more;
    # "leaf-spine" = routed leaves and spines with ECMP between them (workloads/fabric/leafspine.py).
    topology: str | None = None
    leaves: int = 2                  # leaf-spine: leaf routers, nodes / leaves hosts on each
    spines: int = 2                  # leaf-spine: spine routers, one uplink from every leaf to each
    uplink_rate: str | None = None   # leaf-spine: tc rate of each leaf-spine link; None = `rate`
    hash: str = "l4"                 # leaf-spine ECMP: l3 (addresses) | l4 (addresses and ports)
    uplink_latency: str | None = None  # leaf-spine: one-way delay of each leaf-spine link (pods far apart)
    # leaf-spine: a spine whose every uplink runs at another rate, as (spine, rate) pairs, e.g.
    # (("s1", "25mbit"),): one degraded spine that ECMP still hashes half the flows onto
    spine_rates: tuple[tuple[str, str], ...] = ()
    queue: int | None = None         # frames a delay line holds per direction; None: enough for 2x the BDP
    # per-namespace TCP settings of every node, as (name, value) pairs: what `fabricbench tune` varies
    # (congestion control, socket buffers); written with `sysctl -w` inside each node after it is built
    sysctls: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_config(cls, block: Mapping[str, Any] | None, **overrides: Any) -> EmuSpec:
        b = {k: v for k, v in dict(block or {}).items() if v is not None}
        b.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(b) - set(cls.__dataclass_fields__)
        if unknown:
            raise UsageError(f"fabric.emulate has unknown keys {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        rate = b.get("rate")
        if rate in ("none", "null", "unshaped", ""):
            rate = None
        uplink = b.get("uplink_rate")
        spec = cls(nodes=int(b.get("nodes", 2)), rate=None if rate is None else str(rate),
                   qdisc=str(b.get("qdisc", "tbf")), burst=None if b.get("burst") is None else int(b["burst"]),
                   latency=b.get("latency"), mtu=int(b.get("mtu", 1500)),
                   topology=None if b.get("topology") in (None, "auto") else str(b["topology"]),
                   leaves=int(b.get("leaves", 2)), spines=int(b.get("spines", 2)),
                   uplink_rate=None if uplink in (None, "none", "null", "") else str(uplink),
                   hash=str(b.get("hash", "l4")).lower(),
                   uplink_latency=None if b.get("uplink_latency") in (None, "none", "null", "") else str(b["uplink_latency"]),
                   queue=None if b.get("queue") is None else int(b["queue"]),
                   sysctls=_sysctls(b.get("sysctls")), spine_rates=_spine_rates(b.get("spine_rates")))
        spec.check()
        return spec

    @property
    def leaf_spine(self) -> bool:
        return self.topology == "leaf-spine"

    @property
    def uplink(self) -> str | None:
        return self.uplink_rate or self.rate

    def spine_uplink(self, spine: int) -> str | None:
        """The tc rate of every leaf's uplink to spine `spine`: its `spine_rates` entry, else `uplink`."""
        return dict(self.spine_rates).get(f"s{spine}", self.uplink)

    def check(self) -> None:
        if not 2 <= self.nodes <= 64:
            raise UsageError(f"emulate.nodes={self.nodes}; use 2 to 64 namespaces")
        if self.rate is not None:
            rate_bits_per_s(self.rate)
        if self.qdisc not in ("tbf", "htb"):
            raise UsageError(f"emulate.qdisc={self.qdisc!r}; use tbf or htb")
        if self.burst is not None and self.burst < 1600:
            raise UsageError(f"emulate.burst={self.burst} bytes is below one packet; use >= 1600 or null")
        if self.latency is not None:
            delay_us(self.latency)
        self._check_queue()
        if not 576 <= self.mtu <= 65535:
            raise UsageError(f"emulate.mtu={self.mtu}; use 576..65535")
        if self.topology not in (None, "pair", "star", "leaf-spine"):
            raise UsageError(f"emulate.topology={self.topology!r}; use pair (2 nodes), star (a bridge) or leaf-spine")
        if self.topology == "pair" and self.nodes != 2:
            raise UsageError(f"emulate.topology=pair joins 2 nodes, not {self.nodes}; use topology=star or leaf-spine")
        if self.leaf_spine:
            if not 2 <= self.leaves <= 16 or not 1 <= self.spines <= 16:
                raise UsageError(f"emulate.leaves={self.leaves}, spines={self.spines}; use 2-16 leaves and 1-16 spines")
            if self.nodes % self.leaves:
                raise UsageError(f"emulate.nodes={self.nodes} does not fill {self.leaves} leaves evenly; use a multiple "
                                 f"of {self.leaves} nodes (e.g. nodes={self.leaves * max(1, self.nodes // self.leaves)})")
            if self.nodes // self.leaves > 200:
                raise UsageError(f"{self.nodes // self.leaves} hosts per leaf do not fit its /24; use at most 200")
            if self.hash not in ("l3", "l4"):
                raise UsageError(f"emulate.hash={self.hash!r}; use l3 (addresses) or l4 (addresses and ports)")
            if self.uplink_rate is not None:
                rate_bits_per_s(self.uplink_rate)
            for name, rate in self.spine_rates:
                if not (name[:1] == "s" and name[1:].isdigit() and int(name[1:]) < self.spines):
                    raise UsageError(f"emulate.spine_rates names {name!r}, which is not a spine of this leaf-spine; "
                                     f"use s0..s{self.spines - 1}")
                rate_bits_per_s(rate)
        elif self.spine_rates:
            raise UsageError("emulate.spine_rates applies to topology=leaf-spine only; remove it or set topology=leaf-spine")
        elif self.uplink_rate is not None:
            raise UsageError("emulate.uplink_rate applies to topology=leaf-spine only; remove it or set topology=leaf-spine")
        elif self.uplink_latency is not None:
            raise UsageError("emulate.uplink_latency applies to topology=leaf-spine only; use emulate.latency for the "
                             "links of a pair or a star, or set topology=leaf-spine")
        if self.leaf_spine and self.uplink_latency is not None:
            delay_us(self.uplink_latency, "emulate.uplink_latency")

    def delays(self) -> list[tuple[str | None, float]]:
        """(tc rate, one-way delay µs) of every kind of link that has a delay line."""
        out = []
        if self.latency is not None:
            out.append((self.rate, delay_us(self.latency)))
        if self.leaf_spine and self.uplink_latency is not None:
            out.append((self.uplink, delay_us(self.uplink_latency, "emulate.uplink_latency")))
        return out

    def queue_frames(self) -> int:
        """Frames a delay line may hold per direction: `queue`, or twice the largest
        bandwidth-delay product in full-size frames (at least 1000), so the line drops nothing
        at the shaped rate; an unshaped veth has no rate to size by, so 100,000."""
        if self.queue is not None:
            return self.queue
        need = [rate_bits_per_s(r) / 8 * us / 1e6 / self.mtu for r, us in self.delays() if r is not None]
        if len(need) < len(self.delays()):
            return 100_000
        return max(1000, int(2 * max(need, default=0)) + 1)

    def _check_queue(self) -> None:
        if self.queue is None:
            return
        if self.queue < 1:
            raise UsageError(f"emulate.queue={self.queue}; use a positive number of frames, or null to size it")
        for rate, us in ([] if self.latency is None and self.uplink_latency is None else self.delays()):
            if rate is None:
                continue
            bdp = rate_bits_per_s(rate) / 8 * us / 1e6
            if self.queue * self.mtu < bdp:
                raise UsageError(f"emulate.queue={self.queue} frames ({self.queue * self.mtu} B at mtu {self.mtu}) is below "
                                 f"the bandwidth-delay product of {rate} x {us / 1e3:g} ms ({bdp:.0f} B): the line would "
                                 f"drop at the shaped rate; use queue >= {int(bdp / self.mtu) + 1} or null")

    def burst_bytes(self, rate: str | None = None) -> int:
        # tbf needs burst >= rate/HZ; veth hands it GSO packets up to 64 KiB, which tbf
        # would have to split: 128 KiB keeps every one in a single token bucket fill.
        return self.burst or max(128 * 1024, int(rate_bits_per_s(rate or self.rate) / 8 * 0.004))

    def addr(self, node: int) -> str:
        if self.leaf_spine:
            from workloads.fabric import leafspine

            return leafspine.host_addr(node, self.nodes // self.leaves)
        return f"{SUBNET}.{node + 1}"

    def oversubscription(self) -> float | None:
        """A leaf's host bandwidth over its uplink bandwidth (1.0: non-blocking)."""
        if not self.leaf_spine or self.rate is None or self.uplink is None:
            return None
        return (self.nodes // self.leaves) * rate_bits_per_s(self.rate) / (self.spines * rate_bits_per_s(self.uplink))


# Node sysctls an emulated fabric may set: per network namespace on Linux >= 4.15 (so one node's
# setting never leaks to the host or another run), and the ones that shape a TCP transfer.
NODE_SYSCTLS = ("net.ipv4.tcp_congestion_control", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
                "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_notsent_lowat",
                "net.ipv4.tcp_window_scaling", "net.ipv4.tcp_sack", "net.ipv4.tcp_timestamps", "net.ipv4.tcp_ecn")
CC_AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def _spine_rates(raw: Any) -> tuple[tuple[str, str], ...]:
    if raw in (None, {}):
        return ()
    if not isinstance(raw, Mapping):
        raise UsageError(f"emulate.spine_rates={raw!r}: give a mapping of spine to rate, e.g. {{s1: 25mbit}}")
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


def _sysctls(raw: Any) -> tuple[tuple[str, str], ...]:
    """emulate.sysctls ({name: value}) checked: a name outside NODE_SYSCTLS, or a congestion
    control this kernel does not offer, is one line before any namespace exists."""
    if raw in (None, {}):
        return ()
    if not isinstance(raw, Mapping):
        raise UsageError(f"emulate.sysctls={raw!r}: give a mapping, e.g. {{net.ipv4.tcp_congestion_control: bbr}}")
    out = []
    for name, value in sorted((str(k), " ".join(str(value).split())) for k, value in raw.items()):
        if name not in NODE_SYSCTLS:
            raise UsageError(f"emulate.sysctls.{name}: not a per-namespace TCP setting the emulator sets; use one of "
                             f"{', '.join(NODE_SYSCTLS)}")
        if name == "net.ipv4.tcp_congestion_control":
            have = CC_AVAILABLE.read_text().split() if CC_AVAILABLE.is_file() else []
            if have and value not in have:
                raise UsageError(f"emulate.sysctls.{name}={value}: this kernel offers {', '.join(have)} "
                                 f"({CC_AVAILABLE}); pick one of them, or load the module (modprobe tcp_{value})")
        elif (why := kernel_refuses(name, value)):
            raise UsageError(f"emulate.sysctls.{name}={value}: the kernel refuses it ({why}); give what "
                             f"`sysctl {name}` prints, e.g. {namespace_default(name) or 'its current value'}")
        out.append((name, value))
    return tuple(out)


def _proc(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


def kernel_refuses(name: str, value: str) -> str | None:
    """The kernel's own parse of a per-namespace sysctl: the value written in a throwaway network
    namespace (`unshare --net`), which only that namespace sees. None when it takes it, or when
    no namespace can be made here (not root: the emulator cannot run either, and says so)."""
    # the emulator's own command (sysctl -qw in each node namespace), in a namespace of its own
    p = subprocess.run(["unshare", "--net", "sysctl", "-qw", f"{name}={value}"], capture_output=True, text=True,
                       timeout=30)
    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    if p.returncode == 0 or err.startswith("unshare:"):
        return None
    return err.removeprefix("sysctl: ") or f"sysctl exit {p.returncode}"


def namespace_default(name: str) -> str | None:
    """What a new node namespace starts with (a new netns copies some of these from the host,
    tcp_congestion_control among them, and resets others): read in a throwaway one."""
    p = subprocess.run(["unshare", "--net", "cat", _proc(name)], capture_output=True, text=True, timeout=30)
    return " ".join(p.stdout.split()) or None if p.returncode == 0 else None


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise TopologyError(f"`{shlex.join(argv)}` failed ({p.returncode}): {p.stderr.strip().splitlines()[0] if p.stderr.strip() else 'no message'}")
    return p


def require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError("emulated fabrics need root (network namespaces, veth and tc); run as root, "
                         "or use fabric=loopback for a single-machine run without shaping")
    for tool in ("ip", "tc", "nsenter"):
        if not any((Path(d) / tool).exists() for d in os.environ.get("PATH", "/usr/sbin:/usr/bin").split(":") + ["/usr/sbin", "/sbin"]):
            raise UsageError(f"`{tool}` is not installed; install iproute2 and util-linux")


@contextlib.contextmanager
def _host_link_lock(path: Path = HOST_LINK_LOCK):
    """An exclusive lock across processes (flock(2), released when the file closes, also when
    the process dies), on HOST_LINK_LOCK or, where /run/lock is missing or read-only, the same
    name in the temp folder."""
    for where in (path, Path("/tmp") / path.name):
        try:
            f = open(where, "a")
        except OSError:
            continue
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield
        return
    raise UsageError(f"cannot open {path} or /tmp/{path.name} for the host link's lock; make /run/lock writable")


class Topology:
    """The namespaces, veths and qdiscs of one emulated cluster; a context manager that
    always tears them down."""

    def __init__(self, spec: EmuSpec, tag: str | None = None, host_link: bool = False):
        self.spec = spec
        self.tag = tag or str(os.getpid())
        self.nodes = [f"{PREFIX}{self.tag}-{i}" for i in range(spec.nodes)]
        star = spec.topology == "star" or (spec.topology is None and spec.nodes > 2)
        self.bridge_ns = f"{PREFIX}{self.tag}-br" if star else None
        self.leaves, self.spines = leafspine.names(self.tag, spec.leaves, spec.spines) if spec.leaf_spine else ([], [])
        self.sentinels: list[subprocess.Popen] = []  # one idle process per spine (leafspine.read_paths)
        self.created: list[str] = []
        # Links spliced through the delay line: (label, its two ends in delay_ns, one-way µs).
        self.delay_ns = f"{PREFIX}{self.tag}-dl" if spec.delays() else None
        self.delayed: list[tuple[str, str, str, float]] = []
        self.delay_line: subprocess.Popen | None = None
        self.delay_dir: Path | None = None
        # (host end, node 0's address on it): an unshaped link from this host into node 0,
        # for a client (the inference load generator) that must not share the shaped fabric.
        self.host_link = host_link
        self.host_addr: str | None = None

    def namespaces(self) -> list[str]:
        return (self.nodes + ([self.bridge_ns] if self.bridge_ns else []) + self.leaves + self.spines
                + ([self.delay_ns] if self.delay_ns else []))

    def env(self) -> dict[str, str]:
        """What the ranks need to know of the topology: where to read each spine's bytes, and
        what the delay line did."""
        env = {leafspine.PATHS_ENV: leafspine.paths_env(self.sentinels)} if self.sentinels else {}
        if self.delay_dir is not None:
            env[DELAY_ENV] = str(self.delay_dir / "stats.json")
        return env

    def __enter__(self) -> Topology:
        try:
            self.build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def build(self) -> None:
        self._build()
        for ns in self.nodes:
            for name, value in self.spec.sysctls:
                _run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{name}={value}"])

    def _build(self) -> None:
        s = self.spec
        for ns in self.namespaces():
            _run(["ip", "netns", "add", ns])
            self.created.append(ns)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        self._hosts_file()
        if s.leaf_spine:
            if not shutil.which("sysctl"):
                raise UsageError("emulate.topology=leaf-spine needs `sysctl` (routers forward, ECMP hashing): "
                                 "install procps")
            leafspine.build(_run, self._shape, self._veth, s, self.nodes, self.leaves, self.spines)
            self.sentinels = leafspine.start_sentinels(self.spines)
            if self.host_link:
                self._link_host()
            self._start_delay_line()
            return
        if self.bridge_ns is None:
            # Two nodes: one veth pair, emu0 at both ends.
            self._veth(self.nodes[0], IFNAME, self.nodes[1], IFNAME, s.latency, "n0-n1")
        else:
            br = self.bridge_ns
            _run(["ip", "-n", br, "link", "add", "name", "br0", "type", "bridge"])
            _run(["ip", "-n", br, "link", "set", "br0", "up"])
            for i, ns in enumerate(self.nodes):
                port = f"p{i}"
                self._veth(ns, IFNAME, br, port, s.latency, f"n{i}-br")
                _run(["ip", "-n", br, "link", "set", port, "mtu", str(s.mtu), "master", "br0", "up"])
                # The bridge port's egress is the node's ingress: shaped too, so a node
                # receives at most R as a real NIC port would.
                self._shape(br, port)
        for i, ns in enumerate(self.nodes):
            _run(["ip", "-n", ns, "addr", "add", f"{s.addr(i)}/24", "dev", IFNAME])
            _run(["ip", "-n", ns, "link", "set", IFNAME, "up"])
            self._shape(ns, IFNAME)
        if self.host_link:
            self._link_host()
        self._start_delay_line()

    def _veth(self, ns1: str, if1: str, ns2: str, if2: str, latency: str | None, label: str) -> None:
        """A link from if1 in ns1 to if2 in ns2: one veth pair, or, with a delay, two pairs whose
        inner ends (x<k>a, x<k>b) sit in the delay namespace for the delay line to join."""
        mtu = str(self.spec.mtu)
        if latency is None:
            _run(["ip", "link", "add", "name", if1, "netns", ns1, "mtu", mtu, "type", "veth",
                  "peer", "name", if2, "netns", ns2])
            return
        k = len(self.delayed)
        a, b = f"x{k}a", f"x{k}b"
        _run(["ip", "link", "add", "name", if1, "netns", ns1, "mtu", mtu, "type", "veth", "peer", "name", a,
              "netns", self.delay_ns])
        _run(["ip", "link", "add", "name", b, "netns", self.delay_ns, "mtu", mtu, "type", "veth", "peer", "name", if2,
              "netns", ns2])
        for end in (a, b):
            _run(["ip", "-n", self.delay_ns, "link", "set", end, "mtu", mtu, "up"])
        self.delayed.append((label, a, b, delay_us(latency)))

    def _start_delay_line(self, python: str = sys.executable, wait_s: float = 10.0) -> None:
        """One delay-line process in the delay namespace for every delayed link; returns once it
        holds its sockets (its stats file says so), or raises TopologyError with its message."""
        if not self.delayed:
            return
        # in memory where the host has it: the line rewrites its report twice a second, and a
        # write that waits for a busy disk would hold every frame due meanwhile
        shm = Path("/dev/shm")
        self.delay_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{self.tag}-delay-",
                                               dir=shm if os.access(shm, os.W_OK) else None))
        stats = self.delay_dir / "stats.json"
        argv = ["ip", "netns", "exec", self.delay_ns, python, "-m", "workloads.fabric.delayline",
                "--stats", str(stats), "--limit", str(self.spec.queue_frames())]
        for label, a, b, us in self.delayed:
            argv += ["--link", f"{label}:{a}:{b}:{us:g}"]
        err = self.delay_dir / "stderr"
        with open(err, "w") as f:
            # its own session: a Ctrl-C at the terminal reaches the runs, which then need the link
            # to say goodbye over; teardown stops the line last
            # and it ends with its builder, SIGKILL included (a study keeps its arms' lines for hours)
            self.delay_line = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f,
                                               start_new_session=True, cwd=str(Path(__file__).resolve().parents[2]),
                                               preexec_fn=die_with_parent)
        deadline = time.monotonic() + wait_s
        while not stats.exists():
            if self.delay_line.poll() is not None or time.monotonic() > deadline:
                why = err.read_text().strip().splitlines()
                raise TopologyError(f"the delay line did not start ({why[-1] if why else 'no message'})")
            time.sleep(0.02)
        if (json.loads(stats.read_text()) or {}).get("policy") == "other":
            print("warning: the delay line runs at the normal scheduling policy (this host or cgroup refused it a "
                  "real-time priority): on a busy host its delays may miss their tolerance, and those points fail; "
                  "run as root outside a cgroup without a real-time budget, or leave it a core", file=sys.stderr,
                  flush=True)

    def delay_line_problem(self) -> str | None:
        """One line when the delay line has died, else None."""
        p = self.delay_line
        if p is None or p.poll() is None:
            return None
        why = (self.delay_dir / "stderr").read_text().strip().splitlines() if self.delay_dir else []
        return (f"the delay line (pid {p.pid}) died mid-run with exit code {p.returncode}"
                + (f": {why[-1]}" if why else "") + "; the delayed links carry nothing without it")

    def _link_host(self) -> None:
        """A veth from this host's namespace into node 0 (HOST_IFNAME there), on a /30 of
        HOST_SUBNET that no interface here uses yet. Unshaped: it carries the clients'
        requests, not the fabric's traffic. Deleting node 0 deletes it."""
        host_end = f"fbh-{self.tag}"[:15]  # IFNAMSIZ
        _run(["ip", "link", "add", "name", host_end, "type", "veth", "peer", "name", HOST_IFNAME,
              "netns", self.nodes[0]])
        with _host_link_lock():  # from looking until the /30 we chose is visibly ours
            used = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
            third = next((k for k in range(256) if f" {HOST_SUBNET}.{k}." not in used), None)
            if third is None:
                raise UsageError(f"every {HOST_SUBNET}.0.0/16 subnet is in use on this host; remove stale fb- veths "
                                 "(ip link show | grep fbh-)")
            here, there = f"{HOST_SUBNET}.{third}.1", f"{HOST_SUBNET}.{third}.2"
            _run(["ip", "addr", "add", f"{here}/30", "dev", host_end])
        _run(["ip", "link", "set", host_end, "up"])
        _run(["ip", "-n", self.nodes[0], "addr", "add", f"{there}/30", "dev", HOST_IFNAME])
        _run(["ip", "-n", self.nodes[0], "link", "set", HOST_IFNAME, "up"])
        self.host_addr = there

    def _shape(self, ns: str, dev: str, rate: str | None = None) -> None:
        """One egress qdisc at `rate` (default the spec's host rate); none when unshaped."""
        s = self.spec
        rate = rate or s.rate
        if rate is None:
            return
        tc = ["tc", "-n", ns, "qdisc", "add", "dev", dev]
        burst = str(s.burst_bytes(rate))
        if s.qdisc == "tbf":
            # latency: how long a packet may wait for tokens before tbf drops it.
            _run(tc + ["root", "handle", "1:", "tbf", "rate", rate, "burst", burst, "latency", "100ms"])
        else:
            _run(tc + ["root", "handle", "1:", "htb", "default", "10"])
            _run(["tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                  "rate", rate, "ceil", rate, "burst", burst, "cburst", burst])

    def _hosts_file(self) -> None:
        """/etc/netns/<node>/hosts, which `ip netns exec` mounts over /etc/hosts: this host's own
        entries plus every node's address and name. Without it torch's c10d store looked up each
        peer's address in a namespace with no route to the resolver, and printed "The
        hostname of the client socket cannot be retrieved. err=-3" for every connection. Where
        /etc is read-only nothing is written, and only those warnings come back."""
        try:
            base = Path("/etc/hosts").read_text()
        except OSError:
            base = "127.0.0.1 localhost\n"
        # and as IPv4-mapped IPv6: the store listens dual-stack, so it sees its peers as ::ffff:a.b.c.d,
        # which glibc does not look up as a.b.c.d in the hosts file
        names = "".join(f"{self.spec.addr(i)} {node}\n::ffff:{self.spec.addr(i)} {node}\n"
                        for i, node in enumerate(self.nodes))
        for node in self.nodes:
            try:
                d = NETNS_ETC / node
                d.mkdir(parents=True, exist_ok=True)
                (d / "hosts").write_text(base.rstrip("\n") + "\n# fabricbench emulated nodes\n" + names)
            except OSError:
                return

    def teardown(self) -> None:
        """Deleting a namespace deletes its veth ends (and so the pairs) and their qdiscs."""
        leafspine.stop_sentinels(self.sentinels)
        self.sentinels = []
        if self.delay_line is not None:
            if self.delay_line.poll() is None:
                self.delay_line.terminate()
                try:
                    self.delay_line.wait(10)
                except subprocess.TimeoutExpired:
                    self.delay_line.kill()
                    self.delay_line.wait(5)
            self.delay_line = None
        if self.delay_dir is not None:
            shutil.rmtree(self.delay_dir, ignore_errors=True)
            self.delay_dir = None
        for ns in reversed(self.created):
            _run(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        self.created.clear()

    def describe(self) -> str:
        s = self.spec
        shape = "unshaped" if s.rate is None else f"{s.qdisc} rate {s.rate} burst {s.burst_bytes()}B"
        if s.latency:
            shape += f", delay {s.latency} one way (delay line)"
        via = "one veth pair" if self.bridge_ns is None else f"a bridge in {self.bridge_ns}"
        if s.leaf_spine:
            up = "unshaped" if s.uplink is None else f"{s.qdisc} rate {s.uplink}"
            if s.spine_rates:
                up += " (" + ", ".join(f"{k}'s at {v}" for k, v in s.spine_rates) + ")"
            over = s.oversubscription()
            if s.uplink_latency:
                up += f", delay {s.uplink_latency} one way (delay line)"
            via = (f"{s.leaves} leaves ({s.nodes // s.leaves} hosts each) and {s.spines} spines "
                   f"({', '.join(self.spines)}), ECMP {s.hash} hashing, uplinks {up}"
                   + ("" if over is None else f", oversubscription {over:g}:1"))
        text = f"{s.nodes} namespaces ({', '.join(self.nodes)}) joined by {via}; {IFNAME} {shape}"
        if s.sysctls:
            text += "; in every node " + ", ".join(f"{k}={v}" for k, v in s.sysctls)
        if self.host_addr:
            text += f"; clients reach node 0 at {self.host_addr} (unshaped {HOST_IFNAME})"
        return text


def leftovers(prefix: str = PREFIX) -> list[str]:
    """Namespaces of ours still present, and their /etc/netns folders (tests assert this is empty)."""
    p = _run(["ip", "netns", "list"], check=False)
    spaces = [line.split()[0] for line in p.stdout.splitlines() if line.startswith(prefix)]
    folders = [d.name for d in NETNS_ETC.glob(f"{prefix}*")] if NETNS_ETC.is_dir() else []
    return sorted(set(spaces) | set(folders))


CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000   # sched.h
MS_RDONLY, MS_BIND, MS_REC, MS_SLAVE, MNT_DETACH = 1, 4096, 16384, 1 << 19, 2  # sys/mount.h


def enter(name: str) -> None:
    """Move this (single-threaded, freshly forked) process into namespace `name` as `ip netns
    exec` moves the command it runs (iproute2's netns_switch, ip-netns(8)): the namespace's
    network; a mount namespace of its own, mounts not propagated back, with a /sys that shows this
    network's interfaces (the NIC counters are read there); and /etc/netns/<name>/* bound over
    /etc (the nodes' hosts file). OSError names the step that failed."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def call(what: str, rc: int) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        call(f"setns into {name}", libc.setns(fd, CLONE_NEWNET))
    finally:
        os.close(fd)
    call("unshare the mount namespace", libc.unshare(CLONE_NEWNS))
    call("make / a slave mount", libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None))
    flags = 0
    if libc.umount2(b"/sys", MNT_DETACH) != 0 and os.statvfs("/sys").f_flag & os.ST_RDONLY:
        flags = MS_RDONLY  # as iproute2: a read-only /sys we could not unmount stays read-only
    call("mount this namespace's /sys", libc.mount(name.encode(), b"/sys", b"sysfs", flags, None))
    etc = NETNS_ETC / name
    for entry in sorted(etc.iterdir()) if etc.is_dir() else []:
        call(f"bind {entry} over /etc/{entry.name}",
             libc.mount(str(entry).encode(), f"/etc/{entry.name}".encode(), b"none", MS_BIND, None))


def emulated_nodes() -> list[str] | None:
    """The namespaces a served run's ranks go to, when launch/emulate.py started this process."""
    nodes = [n for n in os.environ.get(NODES_ENV, "").split(",") if n]
    return nodes or None
