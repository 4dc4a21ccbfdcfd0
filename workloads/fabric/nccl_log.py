"""Read NCCL's and RCCL's INFO log: which network, which devices, which per-channel transports.

One log file is one process (NCCL_DEBUG_FILE=...%h.%p.log). The lines that matter, as
NCCL 2.x and RCCL print them (host:pid:tid [dev] prefix left out):

    NCCL INFO NCCL version 2.21.5+cuda12.4            (also bare `NCCL version ...`; RCCL: `+hip`)
    NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
    NCCL INFO NET/Plugin: Loaded net plugin NCCL RDMA Plugin v8 (v8)
    NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>
    NCCL INFO NET/IB : Using [0]mlx5_0:1/IB/SHARP [RO]; OOB ib0:10.0.0.1<0>   (SHARP plugin)
    NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
    NCCL INFO NET/IB : No device found.
    NCCL INFO Using network IB | Socket | IBext_v8 | AWS Libfabric
    NCCL INFO comm 0x55d0 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 18000 ... - Init COMPLETE
    NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA
    NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0(1)/GDRDMA        (PXN via rank 1)
    NCCL INFO Channel 02/0 : 1[1] -> 4[0] [receive] via NET/Socket/1
    NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read | P2P/IPC | P2P/direct pointer
    NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct
    NCCL INFO Channel 01/1 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA/Shared  (p2p conn.; net.cc %s%s%s)
    NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/IB/2/GDRDMA(PCI)    (C2C platforms, NCCL >= 2.26)
    NCCL INFO CollNet 00/0 : 0 [send] via COLLNET/IB/0/GDRDMA                (coll_net.cc)
    NCCL INFO Pattern 4, crossNic 0, nChannels 16, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1
                                               (graph/search.cc ncclTopoPrintGraph: intra/inter path type;
                                                RCCL prints XGMI where NCCL prints NVL, topo.cc topoPathTypeStr)
    NCCL INFO                   + NVL[40.0] - GPU/0-19000        (graph/topo.cc ncclTopoPrintRec, the system
    NCCL INFO                   + XGMI[64.0] - GPU/C1000          dump at init: one line per link; RCCL: XGMI)
    RCCL appends ` comm 0x95cdeb0 nRanks 08` to many of these lines.

The parser is pure (text in, summary out) so fixture logs pin it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

_PREFIX = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>[^\]]*)\] NCCL (?P<level>INFO|WARN|TRACE) ")
_RCCL_TRAILER = re.compile(r"\s+comm 0x[0-9a-fA-F]+ nRanks \d+.*$")
# RCCL >= 2.21 prints "RCCL version : 2.21.5-<git hash>" (init.cc VERSION_STRING); older RCCL and NCCL
# "RCCL version 2.18.3+hip6.0 HEAD:..." / "NCCL version 2.21.5+cuda12.4".
_VERSION = re.compile(r"\b(?P<lib>NCCL|RCCL) version(?: :)? (?P<ver>\S+)")
_NETWORK = re.compile(r"\bUsing network (?P<net>.+?)\s*$")
_NET_USING = re.compile(r"\bNET/(?P<net>[^\s:]+)\s*: Using (?P<devs>.*?)(?:\s*;\s*OOB (?P<oob>\S+))?\s*$")
_NO_DEVICE = re.compile(r"\bNET/(?P<net>[^\s:]+)\s*: No device found")
# plugin/net/net_v*.cc (2.30.7): "NET/Plugin: Loaded net plugin %s (v%d)" (name, plugin API version);
# plugin/net.cc:126 "Successfully loaded external network plugin %s" (its library), older NCCL
# "Plugin Path : %s".
_PLUGIN = re.compile(r"\bNET/Plugin\s*: Loaded net plugin (?P<name>.+?)(?: \(v(?P<api>\d+)\))?\s*$")
_PLUGIN_PATH = re.compile(r"\b(?:Successfully loaded external network plugin|Plugin Path :) (?P<path>\S+)")
# Loading is not use: plugin/net.cc (2.30.7) initialises each plugin per communicator, logs
# "Failed to initialize NET plugin %s" (:208, NCCL >= 2.28) when that fails, then tries the next
# one, NCCL's internal IB and Socket last (:299), and logs "Assigned NET plugin %s to comm" (:228,
# NCCL >= 2.27) for the one the communicator takes; init.cc:486 "Using network %s" names it too.
_PLUGIN_FAILED = re.compile(r"\bFailed to initialize NET plugin (?P<name>.+?)\s*$")
_PLUGIN_ASSIGNED = re.compile(r"\bAssigned NET plugin (?P<name>.+?) to comm\s*$")
# The names of NCCL's (and RCCL's) own transports (src/transport/net_ib/common.cc "IB",
# net_socket.cc "Socket"; "IB (stub)" in builds without verbs): a communicator on one of them
# did not use the external plugin that was loaded.
INTERNAL_NETS = ("IB", "Socket", "IB (stub)")
_BOOTSTRAP = re.compile(r"\bBootstrap\s*: Using (?P<ifc>\S+)")
_RANK = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) nranks (?P<nranks>\d+)")
_CHANNEL = re.compile(
    r"\bChannel (?P<ch>\d+)(?:/(?P<sub>\d+))? : (?P<src>\d+)\[[^\]]*\] -> (?P<dst>\d+)\[[^\]]*\]"
    r"(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
_DEVICE = re.compile(r"\[(\d+)\](\S+)")
_COLLNET = re.compile(r"\bCollNet (?P<ch>\d+)(?:/(?P<sub>\d+))? : (?P<rank>\d+) \[(?P<dir>send|receive)\] via (?P<via>.+?)\s*$")
# graph/search.cc: "Pattern %d, crossNic %d, nChannels %d, bw %f/%f, type %s/%s, ..." (older: "speed %f/%f")
_GRAPH = re.compile(r"\bPattern (?P<pattern>\d+), crossNic \d+, nChannels (?P<n>\d+), .*?\btype (?P<intra>[A-Z0-9]+)/(?P<inter>[A-Z0-9]+)")
# graph/topo.cc ncclTopoPrintRec: "+ %s[%2.1f] - %s/..." (link type, bandwidth, remote node type).
# A link to a GPU (NCCL >= 2.30: its DEV node) or an NVSwitch that is neither PCI nor LOC is a
# GPU-to-GPU fabric link (NVL; RCCL's XGMI): a GRAPH line only gives the worst hop of a ring.
_TOPO_LINK = re.compile(r"^\s*\+ (?P<link>[A-Z0-9]+)\[(?P<bw>[0-9.]+)\] - (?P<node>GPU|NVS|DEV)/")
_NOT_GPU_FABRIC = ("PCI", "LOC")
# net.cc:324-331,377: "via NET/%s/%d..." -- the %d is req.netDev, the index of the device in the
# `NET/IB : Using [i]...` list (net_ib/init.cc prints " [%d]%s:%d" with the same d).
_NET_DEV = re.compile(r"^NET/[^/]+/(\d+)")


def transport_key(via: str) -> tuple[str, bool]:
    """`NET/IB/0(1)/GDRDMA` -> ("NET/IB", True); `P2P/CUMEM/read` -> ("P2P/CUMEM", False);
    `SHM/direct/direct` -> ("SHM", False); `NET/AWS Libfabric/0/GDRDMA` -> ("NET/AWS Libfabric", True)."""
    parts = via.strip().split("/")
    # net.cc prints "/GDRDMA" then "(PCI)" (C2C, >= 2.26) then "/Shared" (p2p connections):
    # GDRDMA, GDRDMA(PCI) and GDRDMA/Shared are all GPUDirect RDMA.
    gdr = any(p.startswith("GDRDMA") for p in parts[2:])
    kind = parts[0]
    if kind in ("NET", "P2P") and len(parts) > 1:
        return f"{kind}/{parts[1]}", gdr
    return kind, gdr


def network_family(net: str | None) -> str | None:
    """IB verbs in every flavour (IB, IBext, IBext_v8 from the RDMA/SHARP plugin) -> "IB";
    Socket -> "Socket"; any other plugin keeps its own name (e.g. "AWS Libfabric")."""
    if net is None:
        return None
    if net.startswith("IB"):
        return "IB"
    return net


def _device(token: str, net: str) -> dict:
    if net == "Socket" or ":" not in token or "/" not in token:
        # eth0:10.0.0.1<0>  (IPv6 addresses keep their colons)
        name, _, addr = token.partition(":")
        return {"name": name, "address": re.sub(r"<\d+>$", "", addr) or None}
    # mlx5_0:1/RoCE, mlx5_0:1/IB/SHARP, or NCCL 2.30's mlx5_0:1:0/IB (a rail/plane index after
    # the port): the port is always the first number after the device name.
    head, _, rest = token.partition("/")
    name, *nums = head.split(":")
    port = nums[0] if nums else ""
    link, *extra = rest.split("/")
    d = {"name": name, "port": int(port) if port.isdigit() else None, "link_layer": link}
    if len(nums) > 1:
        d["suffix"] = ":".join(nums[1:])
    if extra:
        d["features"] = extra
    return d


@dataclass
class ProcessLog:
    """What one process's log says. JSON-able via `as_dict`."""

    file: str | None = None
    host: str | None = None
    pid: int | None = None
    rank: int | None = None
    nranks: int | None = None
    library: str | None = None  # NCCL | RCCL
    version: str | None = None
    network: str | None = None  # as NCCL names it: IB, Socket, IBext_v8, AWS Libfabric
    plugin: str | None = None  # the external net plugin the communicator used (NCCL's own IB/Socket: None)
    plugin_api: int | None = None  # its ncclNet API version (the "(v8)")
    plugin_path: str | None = None  # the library NCCL loaded it from
    plugin_loaded: str | None = None  # the external plugin NCCL loaded, used or not
    plugin_failed: str | None = None  # a loaded plugin the communicator did not get: "<name>: <why>"
    assigned: str | None = None  # "Assigned NET plugin %s to comm" (NCCL >= 2.27.3)
    net_devices: dict[str, list[dict]] = field(default_factory=dict)  # "IB" -> [{name, port, link_layer}]
    oob: str | None = None
    bootstrap: str | None = None
    no_device: list[str] = field(default_factory=list)  # ["IB"] after `NET/IB : No device found.`
    channels: dict[str, int] = field(default_factory=dict)  # transport key -> connections this process sends on
    received: dict[str, int] = field(default_factory=dict)  # transport key -> `[receive]` ends logged here
    gdr_channels: int = 0
    net_channels: int = 0
    collnet_channels: int = 0  # `CollNet NN : r [send] via COLLNET/...` (in-network reduction, e.g. SHARP)
    graph_types: list[str] = field(default_factory=list)  # intra-node path types of every GRAPH search (NVL, PIX, ...)
    gpu_links: list[str] = field(default_factory=list)  # link types between GPUs in NCCL's topology dump (NVL, XGMI)
    net_devs_used: list[int] = field(default_factory=list)  # device indices NET channels went through
    gpu_pci_gbps: float | None = None  # the slowest PCI link into a GPU, as NCCL rates it (topo.cc: width x speed / 80)
    lines: int = 0  # NCCL lines seen; 0 means NCCL logged nothing here

    @property
    def family(self) -> str | None:
        return network_family(self.network)

    @property
    def transports(self) -> set[str]:
        """Every transport this process touched, sending or receiving."""
        return set(self.channels) | set(self.received)

    @property
    def devices(self) -> list[dict]:
        """Devices of the network actually used (or every listed network if none was chosen)."""
        if self.network and self.network in self.net_devices:
            return self.net_devices[self.network]
        if self.family == "IB" and "IB" in self.net_devices:
            return self.net_devices["IB"]  # plugin IBext prints its devices as NET/IB
        return [d for ds in self.net_devices.values() for d in ds] if not self.network else []

    @property
    def used_devices(self) -> list[dict]:
        """The listed devices its NET channels went through. NCCL lists every port that matches
        NCCL_IB_HCA (storage ports too), and GPU-NIC affinity leaves some idle. All listed when
        no NET channel named one, or one names an index beyond the list (a merged virtual NIC,
        NCCL_IB_MERGE_NICS, is numbered after the physical ports)."""
        listed = self.devices
        indices = {d.get("index") for d in listed}
        if not self.net_devs_used or not set(self.net_devs_used) <= indices:
            return listed
        return [d for d in listed if d.get("index") in self.net_devs_used]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["family"] = self.family
        d["devices"] = self.devices
        d["used_devices"] = self.used_devices
        d["gdr"] = None if not self.net_channels else self.gdr_channels == self.net_channels
        return d


def parse_text(text: str, file: str | None = None) -> ProcessLog:
    log = ProcessLog(file=file)
    channels: Counter[str] = Counter()
    received: Counter[str] = Counter()
    rank_nranks: list[tuple[int, int]] = []
    for raw in text.splitlines():
        m = _PREFIX.match(raw)
        if m:
            log.host = log.host or m["host"]
            log.pid = log.pid or int(m["pid"])
            msg = raw[m.end():]
        elif "NCCL version" in raw or "RCCL version" in raw:
            msg = raw
        else:
            continue
        log.lines += 1
        if (r := _RANK.search(msg)) is not None:  # before the RCCL trailer is cut: it looks alike
            rank_nranks.append((int(r["rank"]), int(r["nranks"])))
        msg = _RCCL_TRAILER.sub("", msg)
        if (v := _VERSION.search(msg)) is not None and log.version is None:
            log.version = v["ver"]
            log.library = "RCCL" if v["lib"] == "RCCL" or "+hip" in v["ver"] or "rocm" in v["ver"].lower() else "NCCL"
        elif not _connection_line(log, msg, channels, received):
            _network_line(log, msg)
    return _finish(log, text, channels, received, rank_nranks)


def _connection_line(log: ProcessLog, msg: str, channels: Counter[str], received: Counter[str]) -> bool:
    """A line about how GPUs connect (a channel, a CollNet channel, a graph, a topology link)
    read into `log`; False when `msg` is none of them. The order of the tests is the lines'
    precedence: the first pattern that matches owns the line."""
    if (c := _CHANNEL.search(msg)) is not None:
        key, gdr = transport_key(c["via"])
        # both ends name their own NIC: receiving on a port is traffic on it too
        if (nd := _NET_DEV.match(c["via"].strip())) is not None and int(nd[1]) not in log.net_devs_used:
            log.net_devs_used.append(int(nd[1]))
        if c["dir"] == "receive":
            received[key] += 1  # NET connections are logged by both ends: count them on the sender
            return True
        channels[key] += 1
        if key.startswith("NET/"):
            log.net_channels += 1
            log.gdr_channels += gdr
    elif (cn := _COLLNET.search(msg)) is not None:
        if cn["dir"] == "send":
            log.collnet_channels += 1
            channels["COLLNET"] += 1
    elif (g := _GRAPH.search(msg)) is not None:
        if int(g["n"]) and g["intra"] not in log.graph_types:
            log.graph_types.append(g["intra"])
    elif (tl := _TOPO_LINK.search(msg)) is not None:
        if tl["link"] not in _NOT_GPU_FABRIC and tl["link"] not in log.gpu_links:
            log.gpu_links.append(tl["link"])
        elif tl["link"] == "PCI":
            bw = float(tl["bw"])
            log.gpu_pci_gbps = bw if log.gpu_pci_gbps is None else min(log.gpu_pci_gbps, bw)
    else:
        return False
    return True


def _network_line(log: ProcessLog, msg: str) -> None:
    """A line about the network NCCL chose (its name, devices, plugin, bootstrap interface)
    read into `log`, first matching pattern first; any other line is left."""
    if (n := _NETWORK.search(msg)) is not None:
        log.network = n["net"]
    elif (u := _NET_USING.search(msg)) is not None and u["net"] != "Plugin" and _DEVICE.search(u["devs"]):
        log.net_devices[u["net"]] = [_device(t, u["net"]) | {"index": int(i)} for i, t in _DEVICE.findall(u["devs"])]
        if u["oob"]:
            log.oob = re.sub(r"<\d+>$", "", u["oob"])
    elif (nd := _NO_DEVICE.search(msg)) is not None:
        if nd["net"] not in log.no_device:
            log.no_device.append(nd["net"])
    elif (f := _PLUGIN_FAILED.search(msg)) is not None:
        log.plugin_failed = f"{f['name']}: NCCL logged 'Failed to initialize NET plugin'"
    elif (a := _PLUGIN_ASSIGNED.search(msg)) is not None:
        log.assigned = a["name"]
    elif (p := _PLUGIN.search(msg)) is not None:
        log.plugin = log.plugin_loaded = p["name"]
        log.plugin_api = int(p["api"]) if p["api"] else None
    elif (pp := _PLUGIN_PATH.search(msg)) is not None:
        log.plugin_path = pp["path"]
    elif (b := _BOOTSTRAP.search(msg)) is not None:
        log.bootstrap = re.sub(r"<\d+>$", "", b["ifc"])


def _finish(log: ProcessLog, text: str, channels: Counter, received: Counter,
            rank_nranks: list[tuple[int, int]]) -> ProcessLog:
    """What needs the whole log: the world rank, the library, the channel counts."""
    if rank_nranks:
        # The widest communicator is the world group (subgroups come later and are smaller).
        log.rank, log.nranks = max(rank_nranks, key=lambda rn: rn[1])
    if "+hip" in (log.version or ""):
        log.library = "RCCL"
    log.channels = dict(sorted(channels.items()))
    log.received = dict(sorted(received.items()))
    if log.library is None and log.lines and any(_RCCL_TRAILER.search(x) for x in text.splitlines()):
        log.library = "RCCL"
    _plugin_in_use(log)
    return log


def _plugin_in_use(log: ProcessLog) -> None:
    """A loaded external plugin counts only when the communicator ran on it: NCCL falls back to
    its internal IB or Socket when the plugin's init fails (no devices in the container, API
    mismatch). The loaded plugin's name and the network's may differ (the RDMA/SHARP plugin loads
    as "NCCL RDMA Plugin v8" and runs as "IBext_v8"), so the test is whether the network the
    communicator took is one of NCCL's own. Without either line (a log cut short) nothing is known
    and the loaded plugin stands."""
    used = log.assigned or log.network
    if log.plugin_loaded and used in INTERNAL_NETS:
        log.plugin = None
        log.plugin_failed = log.plugin_failed or (f"{log.plugin_loaded}: loaded, but the communicator ran on NCCL's "
                                                  f"internal {used}")


def parse_file(path: str | Path) -> ProcessLog:
    p = Path(path)
    return parse_text(p.read_text(errors="replace"), file=str(p))


def parse_dir(directory: str | Path, pattern: str = "*.log") -> list[ProcessLog]:
    return [parse_file(p) for p in sorted(Path(directory).glob(pattern)) if p.is_file()]


def summarize(logs: list[ProcessLog]) -> dict:
    """One transport summary over processes (ranks): what the record stores."""
    channels: Counter[str] = Counter()
    for lg in logs:
        channels.update(lg.channels)
    versions = sorted({f"{lg.library} {lg.version}" for lg in logs if lg.version})
    def union(per_log) -> dict:
        out = {}
        for lg in logs:
            for d in per_log(lg):
                out.setdefault(d["name"] + (f":{d['port']}" if d.get("port") is not None else ""), d)
        return out

    devices = union(lambda lg: lg.used_devices)  # what carried traffic: line rate and rails read these
    net = sum(lg.net_channels for lg in logs)
    gdr = sum(lg.gdr_channels for lg in logs)
    return {
        "library": versions[0].split()[0] if versions else None,
        "version": versions[0].split()[1] if len(versions) == 1 else (versions or None),
        "networks": sorted({lg.network for lg in logs if lg.network}),
        "devices": list(devices.values()),
        "devices_listed": list(union(lambda lg: lg.devices).values()),
        "link_layers": sorted({d["link_layer"] for d in devices.values() if d.get("link_layer")}),
        "channels": dict(sorted(channels.items())),
        "net_channels": net,
        "gdr": None if not net else gdr == net,
        "gdr_channels": gdr,
        "no_device": sorted({n for lg in logs for n in lg.no_device}),
        "graph_types": sorted({t for lg in logs for t in lg.graph_types}),
        "gpu_links": sorted({t for lg in logs for t in lg.gpu_links}),
        "gpu_pci(GB/s)": min((lg.gpu_pci_gbps for lg in logs if lg.gpu_pci_gbps), default=None),
        "collnet_channels": sum(lg.collnet_channels for lg in logs),
        "plugin": next((lg.plugin for lg in logs if lg.plugin), None),
        "plugin_api": next((lg.plugin_api for lg in logs if lg.plugin_api), None),
        "plugin_path": next((lg.plugin_path for lg in logs if lg.plugin_path), None),
        "plugin_loaded": next((lg.plugin_loaded for lg in logs if lg.plugin_loaded), None),
        "plugin_failed": next((lg.plugin_failed for lg in logs if lg.plugin_failed), None),
        "processes": len(logs),
        "ranks": [lg.as_dict() for lg in logs],
    }
