"""Emulated multi-node fabrics on one Linux machine (needs root).

N network namespaces ("nodes") joined by veth pairs — directly for N = 2, through a
bridge in its own namespace for N > 2 — each node's link shaped on egress with
`tc ... tbf rate R` (or an `htb` class), optionally with netem delay when the kernel has
it. One torchrun agent runs per namespace (static rendezvous: --node_rank, --master_addr
= node 0's veth address), so Gloo's traffic between "nodes" crosses a link of known rate.

    python launch/emulate.py launch/train.py fabric=emu-100m
    python launch/emulate.py --nodes 4 launch/collectives.py fabric=emu-1g
    python launch/emulate.py launch/infer.py fabric=emu-100m server.tp=2

Served inference is the one entry point that does not run in the namespaces: its load
generator runs on this host, and the engine it starts puts its TP ranks in the namespaces —
the reference engine one torchrun agent per namespace (`--serve`), vLLM's and SGLang's node i's
own command in namespace i (`--serve-nodes`); the API server answers on an unshaped veth from this host
into node 0, so only the engine's all_reduces cross the shaped link. server=vllm-pd puts its
prefill instance (and its proxy) in node 0 and its decode instance in node 1, so what crosses
the shaped link is each request's KV cache (workloads/inference/adapters/vllm_pd.py).

The shaping comes from the fabric profile's `emulate:` block (conf/fabric/emu-*.yaml):

    emulate: {nodes: 2, rate: 100mbit, qdisc: tbf, burst: null, latency: null, mtu: 1500}

Everything is built with argv lists (no shell); namespaces are named fb-<pid>-<i> and
removed afterwards — also after a failure, Ctrl-C or SIGTERM — which removes their veths
and qdiscs with them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from workloads import CONF_DIR, catalog
from workloads.core.errors import UsageError
from workloads.fabric import leafspine, noise

IFNAME = "emu0"          # the node's veth inside every namespace; GLOO_SOCKET_IFNAME of emu-*
SUBNET = "10.77.0"       # private to our namespaces: nothing outside them sees it
MASTER_PORT = 29500      # free by construction: node 0's namespace is new
PREFIX = "fb-"           # every namespace we create: fb-<pid>-<suffix>
HOST_IFNAME = "emuh"     # node 0's end of the unshaped link from the host (served inference)
HOST_SUBNET = "10.78"    # a /30 of it per run, for that link
# Set for the load generator of an emulated inference run: the namespaces (comma-separated)
# that the server's ranks must run in, one torchrun agent each (see serve_agents).
NODES_ENV = "FABRICBENCH_EMULATED_NODES"
NETNS_ETC = Path("/etc/netns")  # per-namespace files that `ip netns exec` mounts over /etc (ip-netns(8))
# tc's rate syntax: a number and a unit (bit/s or bytes/s); see tc(8) "PARAMETERS".
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$", re.I)
_UNIT_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_TIME = re.compile(r"^\d+(?:\.\d+)?(us|ms|s)$")


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


class TopologyError(RuntimeError):
    """A command that builds the emulated fabric failed (ip, tc, sysctl): said in one line."""


@dataclass(frozen=True)
class EmuSpec:
    nodes: int = 2
    rate: str | None = None          # None: the veth is not shaped
    qdisc: str = "tbf"               # tbf | htb
    burst: int | None = None         # bytes; None = max(128 KiB, 4 ms at the rate)
    latency: str | None = None       # one-way netem delay per link, e.g. "1ms"
    mtu: int = 1500
    # How the nodes are joined: None = a veth pair for 2 nodes, a bridge (star) for more;
    # "leaf-spine" = routed leaves and spines with ECMP between them (workloads/fabric/leafspine.py).
    topology: str | None = None
    leaves: int = 2                  # leaf-spine: leaf routers, nodes / leaves hosts on each
    spines: int = 2                  # leaf-spine: spine routers, one uplink from every leaf to each
    uplink_rate: str | None = None   # leaf-spine: tc rate of each leaf-spine link; None = `rate`
    hash: str = "l4"                 # leaf-spine ECMP: l3 (addresses) | l4 (addresses and ports)

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
                   hash=str(b.get("hash", "l4")).lower())
        spec.check()
        return spec

    @property
    def leaf_spine(self) -> bool:
        return self.topology == "leaf-spine"

    @property
    def uplink(self) -> str | None:
        return self.uplink_rate or self.rate

    def check(self) -> None:
        if not 2 <= self.nodes <= 64:
            raise UsageError(f"emulate.nodes={self.nodes}; use 2 to 64 namespaces")
        if self.rate is not None:
            rate_bits_per_s(self.rate)
        if self.qdisc not in ("tbf", "htb"):
            raise UsageError(f"emulate.qdisc={self.qdisc!r}; use tbf or htb")
        if self.burst is not None and self.burst < 1600:
            raise UsageError(f"emulate.burst={self.burst} bytes is below one packet; use >= 1600 or null")
        if self.latency is not None and not _TIME.match(str(self.latency)):
            raise UsageError(f"emulate.latency={self.latency!r}; use e.g. 500us or 2ms (or null)")
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
        elif self.uplink_rate is not None:
            raise UsageError("emulate.uplink_rate applies to topology=leaf-spine only; remove it or set topology=leaf-spine")

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


def netem_available() -> bool:
    """Probe in a throwaway namespace: sch_netem is a module many minimal kernels lack."""
    ns = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        return _run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], check=False).returncode == 0
    finally:
        _run(["ip", "netns", "del", ns], check=False)


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
        self.netem = False
        # (host end, node 0's address on it): an unshaped link from this host into node 0,
        # for a client (the inference load generator) that must not share the shaped fabric.
        self.host_link = host_link
        self.host_addr: str | None = None

    def namespaces(self) -> list[str]:
        return self.nodes + ([self.bridge_ns] if self.bridge_ns else []) + self.leaves + self.spines

    def env(self) -> dict[str, str]:
        """What the ranks need to know of the topology: where to read each spine's bytes."""
        return {leafspine.PATHS_ENV: leafspine.paths_env(self.sentinels)} if self.sentinels else {}

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
        s = self.spec
        if s.latency is not None:
            self.netem = netem_available()
            if not self.netem:
                raise UsageError(f"emulate.latency={s.latency} needs the kernel's netem qdisc (sch_netem), which this "
                                 "kernel lacks; set fabric.emulate.latency=null (rate shaping with tbf/htb still works)")
        for ns in self.namespaces():
            _run(["ip", "netns", "add", ns])
            self.created.append(ns)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        self._hosts_file()
        if s.leaf_spine:
            if not shutil.which("sysctl"):
                raise UsageError("emulate.topology=leaf-spine needs `sysctl` (routers forward, ECMP hashing): "
                                 "install procps")
            leafspine.build(_run, self._shape, s, self.nodes, self.leaves, self.spines)
            self.sentinels = leafspine.start_sentinels(self.spines)
            if self.host_link:
                self._link_host()
            return
        if self.bridge_ns is None:
            # Two nodes: one veth pair, emu0 at both ends.
            _run(["ip", "link", "add", "name", IFNAME, "netns", self.nodes[0], "mtu", str(s.mtu), "type", "veth",
                  "peer", "name", IFNAME, "netns", self.nodes[1]])
        else:
            br = self.bridge_ns
            _run(["ip", "-n", br, "link", "add", "name", "br0", "type", "bridge"])
            _run(["ip", "-n", br, "link", "set", "br0", "up"])
            for i, ns in enumerate(self.nodes):
                port = f"p{i}"
                _run(["ip", "link", "add", "name", IFNAME, "netns", ns, "mtu", str(s.mtu), "type", "veth",
                      "peer", "name", port, "netns", br])
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

    def _link_host(self) -> None:
        """A veth from this host's namespace into node 0 (HOST_IFNAME there), on a /30 of
        HOST_SUBNET that no interface here uses yet. Unshaped: it carries the clients'
        requests, not the fabric's traffic. Deleting node 0 deletes it."""
        used = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
        third = next((k for k in range(256) if f" {HOST_SUBNET}.{k}." not in used), None)
        if third is None:
            raise UsageError(f"every {HOST_SUBNET}.0.0/16 subnet is in use on this host; remove stale fb- veths "
                             "(ip link show | grep fbh-)")
        here, there = f"{HOST_SUBNET}.{third}.1", f"{HOST_SUBNET}.{third}.2"
        host_end = f"fbh-{self.tag}"[:15]  # IFNAMSIZ
        _run(["ip", "link", "add", "name", host_end, "type", "veth", "peer", "name", HOST_IFNAME,
              "netns", self.nodes[0]])
        _run(["ip", "addr", "add", f"{here}/30", "dev", host_end])
        _run(["ip", "link", "set", host_end, "up"])
        _run(["ip", "-n", self.nodes[0], "addr", "add", f"{there}/30", "dev", HOST_IFNAME])
        _run(["ip", "-n", self.nodes[0], "link", "set", HOST_IFNAME, "up"])
        self.host_addr = there

    def _shape(self, ns: str, dev: str, rate: str | None = None) -> None:
        """One egress qdisc: `rate` (default the spec's host rate), netem delay when asked."""
        s = self.spec
        rate = rate or s.rate
        if rate is None and not self.netem:
            return
        tc = ["tc", "-n", ns, "qdisc", "add", "dev", dev]
        parent = "root"
        if rate is not None:
            burst = str(s.burst_bytes(rate))
            if s.qdisc == "tbf":
                # latency: how long a packet may wait for tokens before tbf drops it.
                _run(tc + ["root", "handle", "1:", "tbf", "rate", rate, "burst", burst, "latency", "100ms"])
                parent = "1:1"
            else:
                _run(tc + ["root", "handle", "1:", "htb", "default", "10"])
                _run(["tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                      "rate", rate, "ceil", rate, "burst", burst, "cburst", burst])
                parent = "1:10"
        if self.netem:
            where = ["root"] if parent == "root" else ["parent", parent, "handle", "10:"]
            _run(tc + where + ["netem", "delay", str(s.latency)])

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
        for ns in reversed(self.created):
            _run(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        self.created.clear()

    def describe(self) -> str:
        s = self.spec
        shape = "unshaped" if s.rate is None else f"{s.qdisc} rate {s.rate} burst {s.burst_bytes()}B"
        if s.latency:
            shape += f", netem delay {s.latency}"
        via = "one veth pair" if self.bridge_ns is None else f"a bridge in {self.bridge_ns}"
        if s.leaf_spine:
            up = "unshaped" if s.uplink is None else f"{s.qdisc} rate {s.uplink}"
            over = s.oversubscription()
            via = (f"{s.leaves} leaves ({s.nodes // s.leaves} hosts each) and {s.spines} spines "
                   f"({', '.join(self.spines)}), ECMP {s.hash} hashing, uplinks {up}"
                   + ("" if over is None else f", oversubscription {over:g}:1"))
        text = f"{s.nodes} namespaces ({', '.join(self.nodes)}) joined by {via}; {IFNAME} {shape}"
        if self.host_addr:
            text += f"; clients reach node 0 at {self.host_addr} (unshaped {HOST_IFNAME})"
        return text


def leftovers(prefix: str = PREFIX) -> list[str]:
    """Namespaces of ours still present, and their /etc/netns folders (tests assert this is empty)."""
    p = _run(["ip", "netns", "list"], check=False)
    spaces = [line.split()[0] for line in p.stdout.splitlines() if line.startswith(prefix)]
    folders = [d.name for d in NETNS_ETC.glob(f"{prefix}*")] if NETNS_ETC.is_dir() else []
    return sorted(set(spaces) | set(folders))


def agent_argv(python: str, spec: EmuSpec, node: int, nproc: int, entry: str, overrides: Sequence[str],
               job: Sequence[int] | None = None) -> list[str]:
    """One torchrun agent for `node`, static rendezvous on node 0's veth address (run by
    agent_main below: torchrun's own machinery, a failed rank reported in one line). `job`: the
    nodes of this node's job when several share the fabric (their first node hosts its rendezvous)."""
    job = list(range(spec.nodes)) if job is None else list(job)
    return [python, "-m", "workloads.fabric.emulate", "--agent", f"--nnodes={len(job)}",
            f"--node_rank={job.index(node)}", f"--nproc_per_node={nproc}", f"--master_addr={spec.addr(job[0])}",
            f"--master_port={MASTER_PORT}", f"--local_addr={spec.addr(node)}", "--max_restarts=0", entry, *overrides]


def run_agents(topo: Topology, nproc: int, entry: str, overrides: Sequence[str], timeout_s: float,
               python: str = sys.executable, env: Mapping[str, str] | None = None) -> int:
    """Start one torchrun agent per namespace, wait for all, return the first failure's exit
    code (0 when all succeeded). A timeout or Ctrl-C stops every agent."""
    base = _node_env(os.environ if env is None else env, topo.tag) | topo.env()
    argvs = [agent_argv(python, topo.spec, i, nproc, entry, overrides) for i in range(topo.spec.nodes)]
    return run_in_nodes(topo.nodes, argvs, [base] * len(argvs), timeout_s)


def _node_env(env: Mapping[str, str], tag: str) -> dict[str, str]:
    """What every process in a node gets: Gloo on the emulated link, one thread per rank, and
    one run id for all nodes (static rendezvous has no shared id to derive it from)."""
    base = dict(env)
    base.setdefault("FABRICBENCH_RUN_ID", f"emu-{time.strftime('%Y%m%d-%H%M%S')}-{tag}")
    base.setdefault("OMP_NUM_THREADS", "1")
    base["GLOO_SOCKET_IFNAME"] = IFNAME
    return base


def run_jobs(topo: Topology, k: int, nproc: int, entry: str, overrides: Sequence[str], timeout_s: float,
             output_root: str, fabric: str) -> int:
    """K concurrent jobs on disjoint nodes (workloads/fabric/jobs.py): started together, each its
    own world; their JCTs, primary metrics and Jain's fairness over them printed and written."""
    from workloads.fabric import jobs

    groups = jobs.split(topo.spec.nodes, k)
    base = _node_env(os.environ, topo.tag) | topo.env()
    argvs, envs, run_ids = [None] * topo.spec.nodes, [None] * topo.spec.nodes, []
    for j, nodes in enumerate(groups):
        mine, named = jobs.job_overrides(overrides, j)
        run_ids.append(named or f"{base['FABRICBENCH_RUN_ID']}-job{j}")
        for i in nodes:
            argvs[i] = agent_argv(sys.executable, topo.spec, i, nproc, entry, mine, job=nodes)
            envs[i] = base | {"FABRICBENCH_RUN_ID": run_ids[j]}
    ended: dict[int, float] = {}
    start = time.monotonic()
    code = run_in_nodes(topo.nodes, argvs, envs, timeout_s, ended=ended, independent=groups)
    per_job = []
    for j, nodes in enumerate(groups):
        metric, value, status = jobs.primary_of(Path(output_root) / run_ids[j])
        per_job.append({"job": j, "nodes": nodes, "run_id": run_ids[j], "status": status,
                        "exit_code": max((ended.get(i, (None, 124))[1] for i in nodes), key=abs),
                        "jct_s": max(ended.get(i, (time.monotonic(), 0))[0] for i in nodes) - start,
                        "metric": metric, "value": value})
    named = [o.split("=", 1)[1] for o in overrides if o.startswith("fabric.name=")]
    summary = jobs.summarize(per_job) | {"entry": entry, "fabric": topo.describe(),
                                         "fabric_name": named[-1] if named else fabric}
    for line in jobs.rows(summary):
        print(line, flush=True)
    print(f"jobs summary: {jobs.write(summary, output_root, topo.tag)}", flush=True)
    return code


def run_in_nodes(nodes: Sequence[str], argvs: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]],
                 timeout_s: float, ended: dict[int, tuple[float, int]] | None = None,
                 independent: Sequence[Sequence[int]] | None = None) -> int:
    """`argvs[i]` in namespace `nodes[i]` (`ip netns exec`: the namespace's network, and a /sys
    that shows its interfaces), each in a session of its own; wait for all, stop all when one
    fails, times out or we are interrupted, and return the first failure's exit code."""
    procs: list[subprocess.Popen] = []
    try:
        with _signals_deferred():
            for ns, argv, env in zip(nodes, argvs, envs):
                # `ip netns exec`, not bare nsenter: it also gives the process a mount namespace
                # whose /sys shows this namespace's interfaces (preflight reads them there).
                procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *argv], env=dict(env),
                                              start_new_session=True))
        deadline = time.monotonic() + timeout_s
        codes: dict[int, int] = {}
        while len(codes) < len(procs):
            for i, p in enumerate(procs):
                if i not in codes and p.poll() is not None:
                    codes[i] = p.returncode
                    if ended is not None:
                        ended[i] = (time.monotonic(), p.returncode)
            if any(codes.values()):
                if not independent:
                    break  # one node failed: the others would wait for it until their timeout
                for job in independent:  # concurrent jobs: a failed job's nodes stop, the others run on
                    if any(codes.get(i) for i in job):
                        for i in job:
                            if i not in codes and procs[i].poll() is None:
                                _killpg(procs[i], signal.SIGTERM)
            if time.monotonic() > deadline:
                print(f"error: emulated run exceeded {timeout_s:g}s; stopping all agents", file=sys.stderr)
                return 124
            time.sleep(0.2)
        bad = {i: c for i, c in codes.items() if c}
        if bad:
            i, c = min(bad.items())
            print(f"error: node {i} ({nodes[i]}) exited with code {c}; its message is above", file=sys.stderr)
            return c if c > 0 else 1
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                _killpg(p, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _killpg(p, signal.SIGKILL)
                p.wait(timeout=5)


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C or SIGTERM while the agents start is acted on once every started one is in the
    list the cleanup stops: raised inside Popen, after its fork, it orphaned that agent, which
    held the caller's pipes open (a SIGTERM test hung twice). Main thread only, as signals are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if pending:
        raise KeyboardInterrupt


def _killpg(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


LOOPBACK = "lo"


def _sigterm_as_interrupt(signum, frame):  # SIGTERM cleans up like Ctrl-C
    raise KeyboardInterrupt


def spec_from_overrides(conf_dir: str, overrides: Sequence[str], nproc_per_node: int = 1,
                        config_name: str = "config", jobs: int = 1, **cli: Any) -> tuple[EmuSpec, str]:
    """Compose the Hydra config the entry will see (every point, for a -m sweep such as
    trial=0,1,2,3) and read its fabric's emulate: block; one topology serves them all."""
    from workloads.core.launcher import compose, expand_sweep, validate_job

    plain = [o for o in overrides if o not in ("-m", "--multirun")]
    points = expand_sweep(plain) if len(plain) < len(overrides) else [plain]
    found = set()
    for point in points:
        cfg = compose(conf_dir, point, config_name)
        spec = _spec_of(cfg, cli)
        found.add(spec)
        if any(w.served and w.config == config_name for w in catalog.CATALOG.values()):
            _check_served(cfg, spec[0])
            continue  # the load generator checks the rest itself, before it starts the server
        # The whole config, for the world it will run at, before any namespace exists (whose
        # interface does not exist yet either: lo stands in for it in the host checks).
        validate_job(compose(conf_dir, [*point, f"fabric.env.GLOO_SOCKET_IFNAME={LOOPBACK}"]),
                     spec[0].nodes // max(jobs, 1) * nproc_per_node)
    if len(found) > 1:
        raise UsageError(f"the sweep's points need {len(found)} different emulated fabrics, and one emulate run "
                         "builds one topology: sweep fabrics as separate emulate runs")
    return found.pop()


def _spec_of(cfg, cli: Mapping[str, Any]) -> tuple[EmuSpec, str]:
    from omegaconf import OmegaConf

    block = OmegaConf.to_container(cfg.fabric, resolve=True).get("emulate")
    if isinstance(block, dict):  # background traffic is the noise module's (checked there, not a link setting)
        noise.NoiseSpec.from_config(block.pop("noise", None))
    if block is None:
        raise UsageError(f"fabric={cfg.fabric.name} has no emulate: block; use fabric=emu-100m or fabric=emu-1g "
                         "(or add an emulate: block to your fabric profile)")
    if str(cfg.fabric.get("env", {}).get("GLOO_SOCKET_IFNAME")) != IFNAME:
        raise UsageError(f"fabric={cfg.fabric.name} must set env.GLOO_SOCKET_IFNAME: {IFNAME} (the emulated link's name)")
    return EmuSpec.from_config(block, **cli), str(cfg.fabric.name)


def _check_served(cfg, spec: EmuSpec) -> None:
    """Served inference across the namespaces: an engine that can span nodes here (the reference
    engine, one torchrun agent per namespace; vLLM and SGLang, their multi-node modes), TP split evenly."""
    if spec.leaf_spine:
        raise UsageError("served inference does not run on an emulated leaf-spine yet (its engines' nodes are "
                         "addressed on one flat link); use fabric.emulate.topology=null, or a training, "
                         "collectives or link run on the leaf-spine")
    adapter = str(cfg.server.get("adapter") or cfg.server.get("name"))
    if adapter == "vllm_pd":
        # disaggregated serving: the prefill instance in node 0, the decode instance in node 1, each at
        # server.tp on its own node, so the KV cache (not TP all_reduces) crosses the shaped link
        if spec.nodes != 2:
            raise UsageError(f"server=vllm-pd runs its prefill instance in node 0 and its decode instance in node 1; "
                             f"use 2 emulated nodes, not {spec.nodes} (fabric.emulate.nodes=2 or --nodes 2)")
        return
    if adapter not in ("reference", "vllm", "sglang"):
        raise UsageError(f"server={adapter} does not run across emulated nodes here; use server=reference, "
                         "server=vllm, server=sglang or server=vllm-pd")
    tp = cfg.server.get("tp")
    if tp is None or int(tp) % spec.nodes or int(tp) < spec.nodes:
        shown = "null" if tp is None else tp
        raise UsageError(f"server.tp={shown} cannot span {spec.nodes} emulated nodes evenly; use "
                         f"server.tp={spec.nodes} (or a multiple of {spec.nodes})")


def add_arguments(ap) -> None:
    """`fabricbench emulate ...` and launch/emulate.py share this parser."""
    import argparse

    ap.description = ("Run a fabricbench entry point across emulated nodes (network namespaces joined by "
                      "shaped veth links), one torchrun agent per namespace. Needs root.")
    ap.add_argument("--nodes", type=int, help="namespaces (overrides fabric.emulate.nodes)")
    ap.add_argument("--nproc-per-node", type=int, default=1, help="ranks per namespace [1]")
    ap.add_argument("--rate", help="tc rate, e.g. 100mbit (overrides fabric.emulate.rate; 'none' = unshaped)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before every agent is stopped [900]")
    ap.add_argument("--jobs", type=int, default=1,
                    help="concurrent jobs on disjoint nodes sharing the fabric: JCT and Jain's fairness [1]")
    ap.add_argument("entry", help="launch/train.py, launch/collectives.py, launch/link.py or launch/infer.py")
    ap.add_argument("overrides", nargs=argparse.REMAINDER, help="Hydra overrides, e.g. fabric=emu-100m")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="launch/emulate.py")
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args, conf_dir: str | None = None) -> int:
    conf_dir = conf_dir or CONF_DIR
    old = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        serving = _check_entry(args)
        if args.jobs != 1 and serving:
            raise UsageError(f"--jobs {args.jobs} runs concurrent training, collectives or link jobs; served inference "
                             "runs one server: drop --jobs")
        config_name = catalog.for_script(args.entry)[0].config
        spec, fabric = spec_from_overrides(conf_dir, args.overrides, nodes=args.nodes, rate=args.rate,
                                           nproc_per_node=args.nproc_per_node, config_name=config_name,
                                           jobs=args.jobs)
        output_root = None
        if args.jobs != 1:
            from workloads.core.launcher import compose
            from workloads.fabric.jobs import split

            split(spec.nodes, args.jobs)
            plain = [o for o in args.overrides if o not in ("-m", "--multirun")]
            output_root = str(compose(conf_dir, plain, config_name).output_root)
        if args.rate is not None:
            # The record must not claim a shaping the link did not have: the rate goes into
            # the config, and the fabric gets a name of its own unless the user gave one.
            args.overrides.append(f"fabric.emulate.rate={'null' if spec.rate is None else spec.rate}")
            if not any(o.startswith("fabric.name=") for o in args.overrides):
                args.overrides.append(f"fabric.name=emu-{'veth' if spec.rate is None else spec.rate}")
        # Likewise the topology the record describes is the one built: --nodes, and a leaf-spine's
        # defaults that the profile did not spell out.
        if args.nodes is not None:
            args.overrides.append(f"++fabric.emulate.nodes={spec.nodes}")
        if spec.leaf_spine:
            args.overrides += [f"++fabric.emulate.{k}={'null' if v is None else v}" for k, v in
                               (("leaves", spec.leaves), ("spines", spec.spines), ("hash", spec.hash),
                                ("uplink_rate", spec.uplink_rate))]
        loud, noise_dir, run_id = noise.from_overrides(conf_dir, args.overrides,
                                                       catalog.for_script(args.entry)[0].config)
        if loud is not None:
            loud.require()
            if args.jobs != 1:
                raise UsageError("fabric.emulate.noise runs beside one job; with --jobs each job is the others' "
                                 "noise: drop the noise block or --jobs")
        require_root()
        with Topology(spec, host_link=serving) as topo:
            print(f"emulate: {topo.describe()}", flush=True)
            addrs = [spec.addr(i) for i in range(spec.nodes)]
            with noise.running(loud, topo.nodes, addrs, noise_dir, args.timeout) as noise_env:
                env = {**os.environ, **noise_env, "FABRICBENCH_RUN_ID": run_id} if noise_env else None
                if serving:
                    return run_load_generator(topo, args.entry, args.overrides, args.timeout, env=env)
                if args.jobs != 1:
                    return run_jobs(topo, args.jobs, args.nproc_per_node, args.entry, args.overrides, args.timeout,
                                    output_root, fabric)
                return run_agents(topo, args.nproc_per_node, args.entry, args.overrides, args.timeout, env=env)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except TopologyError as e:  # the namespaces made so far are gone: Topology tears down what it built
        print(f"error: could not build the emulated fabric: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: agents stopped, namespaces removed", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)


def _check_entry(args) -> bool:
    """UsageError for an entry point that cannot run across the namespaces; True for served
    inference (its load generator runs here, its server's ranks there)."""
    crossing = catalog.scripts(crosses_link=True)
    use = f"use {', '.join(crossing[:-1])} or {crossing[-1]}" if len(crossing) > 1 else f"use {crossing[0]}"
    if not Path(args.entry).is_file():
        raise UsageError(f"entry point {args.entry} does not exist; {use}")
    runs = catalog.for_script(args.entry)
    if not runs or not all(w.crosses_link for w in runs):
        raise UsageError(f"{args.entry} does not run across emulated nodes; {use}")
    if args.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node={args.nproc_per_node}; use 1 or more")
    if len(runs) == 1 and runs[0].overrides and not any(o.lstrip("+").startswith("workload=") for o in args.overrides):
        from workloads.core.launcher import add_override

        # as that entry point does itself, and in the same place: beside the other overrides,
        # never before a -m (Hydra would then take the rest as unrecognized arguments)
        argv = [args.entry, *args.overrides]
        for o in runs[0].overrides:
            add_override(argv, o)
        args.overrides = argv[1:]
    return any(w.served for w in runs)


def run_load_generator(topo: Topology, entry: str, overrides: Sequence[str], timeout_s: float,
                       python: str = sys.executable, env: Mapping[str, str] | None = None) -> int:
    """Served inference: the load generator runs in this host's namespace and starts the
    server through the reference adapter, which finds the namespaces in NODES_ENV and runs
    one torchrun agent per node there (serve_agents). Rank 0 answers HTTP on node 0's end of
    the unshaped host link; the TP all_reduces cross the shaped emu0 link."""
    argv = [python, entry, *overrides, f"server.host={topo.host_addr}", f"server.nnodes={topo.spec.nodes}",
            f"server.dist_init_addr={topo.spec.addr(0)}:{MASTER_PORT}"]
    env = dict(os.environ if env is None else env) | {NODES_ENV: ",".join(topo.nodes)}
    p = subprocess.Popen(argv, env=env)
    try:
        return p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"error: emulated run exceeded {timeout_s:g}s; stopping the load generator and its server",
              file=sys.stderr)
        return 124
    finally:
        if p.poll() is None:  # it stops its own server on SIGTERM (workloads/inference/run.py)
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def emulated_nodes() -> list[str] | None:
    """The namespaces a served run's ranks go to, when launch/emulate.py started this process."""
    nodes = [n for n in os.environ.get(NODES_ENV, "").split(",") if n]
    return nodes or None


def serve_agents(nproc: int, entry: str, overrides: Sequence[str]) -> int:
    """`python -m workloads.fabric.emulate --serve <nproc> <entry> <overrides>`: one torchrun
    agent per namespace named in NODES_ENV (the reference engine), for as long as it serves."""
    nodes = emulated_nodes() or []
    spec = EmuSpec(nodes=max(2, len(nodes)))
    return _serve(nodes, [agent_argv(sys.executable, spec, i, nproc, entry, overrides) for i in range(len(nodes))],
                  [{}] * len(nodes))


def agent_main(torchrun_args: Sequence[str]) -> int:
    """`python -m workloads.fabric.emulate --agent <torchrun args>`: torchrun in this namespace."""
    from workloads.core.launcher import torchrun

    return torchrun(list(torchrun_args))


def serve_nodes(per_node_json: str) -> int:
    """`python -m workloads.fabric.emulate --serve-nodes '[{"argv": [...], "env": {...}}, ...]'`:
    an engine that starts each node itself (vLLM: node 0's API server, headless workers on the
    others; SGLang: node 0's API server and schedulers, schedulers only on the others), entry i
    in the i-th namespace of NODES_ENV, for as long as the server runs."""
    import json

    per_node = json.loads(per_node_json)
    return _serve(emulated_nodes() or [], [n["argv"] for n in per_node], [n["env"] for n in per_node])


def _serve(nodes: list[str], argvs: list[list[str]], envs: list[dict[str, str]]) -> int:
    """A server's processes, argvs[i] in namespace nodes[i], until one ends or the orchestrator
    stops us with SIGTERM (turned into KeyboardInterrupt: every node's process is stopped)."""
    if len(nodes) < 2 or len(nodes) != len(argvs):
        print(f"error: {len(argvs)} node command(s) for the {len(nodes)} emulated nodes in {NODES_ENV}; run "
              "through launch/emulate.py", file=sys.stderr)
        return 2
    base = _node_env(os.environ, nodes[0].removeprefix(PREFIX).rsplit("-", 1)[0])
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        return run_in_nodes(nodes, argvs, [base | env for env in envs], float("inf"))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    from workloads.core.launcher import end  # torchrun's agent ran here: no interpreter teardown

    if sys.argv[1:2] == ["--agent"]:
        end(agent_main(sys.argv[2:]))
    if sys.argv[1:2] == ["--serve"]:
        end(serve_agents(int(sys.argv[2]), sys.argv[3], sys.argv[4:]))
    if sys.argv[1:2] == ["--serve-nodes"]:
        sys.exit(serve_nodes(sys.argv[2]))
    sys.exit(main())
