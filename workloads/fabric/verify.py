"""The verdict: did the run use the transport its fabric label claims?

    result = check_transport(profile, run_dir, info)   # every rank calls it, after the first collective

Each rank collects its own evidence (NCCL/RCCL: its own INFO log file; Gloo: the TCP
sockets of this process), all ranks gather it, rank 0 decides against the profile's
`expect:` block and broadcasts the decision, so every rank raises (or not) together.
A mismatch raises `TransportMismatch` with one message unless `fabric.verify=warn`
(printed and recorded) or `off` (not checked).

`expect:` keys (conf/fabric/*.yaml):
  network            IB | Socket | <plugin name> | null   NCCL's `Using network` (IBext* counts as IB)
  plugin             none | <text>                        the external net plugin (NET/Plugin: Loaded net
                                                          plugin ...): none = NCCL's own transports only;
                                                          text = the plugin's name must contain it
  link_layer         IB | RoCE                            of every device of the NET/IB line
  forbid_transports  [prefix, ...]                        no channel may go via these (NET/Socket)
  allow_transports   [prefix, ...]                        every channel must go via one of these
  gdr                true                                 every NET channel must be GPUDirect RDMA
  forbid_graph_types [NVL, ...]                           no GRAPH search may find this intra-node path
                                                          type (graph/search.cc `type %s/%s`: NVLink is NVL)
  forbid_gpu_links   [NVL, XGMI]                          no GPU-to-GPU link of these types in NCCL's
                                                          topology dump (graph/topo.cc ncclTopoPrintRec)
  interfaces         [name, ...]                          (Gloo) the interfaces ranks must bind
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import subprocess
from glob import glob
from pathlib import Path
from typing import Any, Mapping

from workloads.fabric import nccl_log
from workloads.core.errors import TransportMismatch

# ---------------------------------------------------------------------------------------
# small helpers


def rank_list(ranks: list[int]) -> str:
    """[0,1,2,3,5] -> "ranks 0–3, 5"; [4] -> "rank 4"."""
    rs = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in rs:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    parts = [f"{a}" if a == b else f"{a}, {b}" if b == a + 1 else f"{a}–{b}" for a, b in runs]
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def _group(by_rank: dict[int, str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r, v in sorted(by_rank.items()):
        out.setdefault(v, []).append(r)
    return out


# ---------------------------------------------------------------------------------------
# NCCL / RCCL: the verdict from per-rank log summaries (pure)


# Problems that mean "no evidence", not "wrong evidence": a verdict made only of these is
# "unverified" (fabric.verify=fail still stops the run, with the reason).
UNVERIFIED_MARKS = ("wrote no NCCL INFO log", "no Gloo peer", "logged no channel", "logged no GRAPH line",
                    "rank log(s) missing")
CHANNEL_RULES = ("forbid_transports", "allow_transports", "gdr")


def nccl_problems(expect: Mapping[str, Any], ranks: list[dict]) -> list[str]:
    """`ranks` holds one `ProcessLog.as_dict()` per process. Returns what disagrees with
    `expect`, naming each process by the rank NCCL gave it (its `comm ... rank r` line): a
    server's logs come in file-name order (host, pid), not rank order. The list position
    stands in only for a log that printed no rank."""
    problems = []
    named = [(i if r.get("rank") is None else r["rank"], r) for i, r in enumerate(ranks)]
    silent = [i for i, r in named if not r.get("lines")]
    if silent:
        problems.append(f"{rank_list(silent)} wrote no NCCL INFO log")
    talking = [(i, r) for i, r in named if r.get("lines")]
    if any(expect.get(k) for k in CHANNEL_RULES) and len(ranks) > 1:
        # NCCL >= 2.22 connects channels lazily (NCCL_RUNTIME_CONNECT): before a real
        # collective the log holds no "Channel ... via" line and every channel rule would pass
        # on nothing.
        bare = [i for i, r in talking if not _transports(r)]
        if bare:
            problems.append(f"{rank_list(bare)} logged no channel (no collective had connected one), "
                            "so the channel rules were not checked")
    problems += _graph_problems(expect, talking)
    want_net = expect.get("network")
    if want_net:
        actual = {i: ("NET/" + r["network"] if r.get("network") else "no 'Using network' line")
                  for i, r in talking if nccl_log.network_family(r.get("network")) != want_net}
        for what, rs in _group(actual).items():
            problems.append(f"{rank_list(rs)} {'used ' + what if what.startswith('NET/') else 'logged ' + what}")
    problems += _plugin_problems(expect.get("plugin"), talking)
    want_link = expect.get("link_layer")
    if want_link:
        wrong = {}
        for i, r in talking:
            if nccl_log.network_family(r.get("network")) != "IB":
                continue  # already reported as a network mismatch
            bad = [d for d in r.get("devices") or [] if d.get("link_layer") != want_link]
            if bad:
                wrong[i] = ", ".join(f"{d['name']}:{d.get('port')}/{d.get('link_layer')}" for d in bad)
        for what, rs in _group(wrong).items():
            problems.append(f"{rank_list(rs)} used {what} (link layer is not {want_link})")
    for prefix in expect.get("forbid_transports") or []:
        hit = {i: ", ".join(sorted(t for t in _transports(r) if t.startswith(prefix))) for i, r in talking}
        for what, rs in _group({i: v for i, v in hit.items() if v}).items():
            problems.append(f"{rank_list(rs)} have channels via {what}")
    allowed = expect.get("allow_transports")
    if allowed:
        off = {i: ", ".join(sorted(t for t in _transports(r) if not any(t.startswith(a) for a in allowed)))
               for i, r in talking}
        for what, rs in _group({i: v for i, v in off.items() if v}).items():
            problems.append(f"{rank_list(rs)} have channels via {what} (allowed: {', '.join(allowed)})")
    if expect.get("gdr"):
        no_gdr = [i for i, r in talking if r.get("net_channels") and r.get("gdr_channels") != r.get("net_channels")]
        if no_gdr:
            problems.append(f"{rank_list(no_gdr)} have NET channels without GPUDirect RDMA (no /GDRDMA)")
    return problems


def _plugin_problems(want: str | None, talking: list[tuple[int, dict]]) -> list[str]:
    """An external net plugin (SHARP's IBext, aws-ofi, Spectrum-X, gIB, ...) replaces NCCL's
    own IB transport with its own code and tuning: a run labelled for one must not run on
    another. `want`: none, or text the plugin's name must contain; absent = not checked."""
    if want is None:
        return []
    wrong = {}
    for i, r in talking:
        name = r.get("plugin")
        if str(want).lower() == "none":
            if name:
                wrong[i] = f"loaded net plugin {name!r}" + (f" from {r['plugin_path']}" if r.get("plugin_path") else "")
        elif not name or str(want).lower() not in name.lower():
            wrong[i] = f"loaded {'net plugin ' + repr(name) if name else 'no net plugin'}"
    expected = "none" if str(want).lower() == "none" else f"one named like {want!r}"
    return [f"{rank_list(rs)} {what} (expected plugin: {expected})" for what, rs in _group(wrong).items()]


def _graph_problems(expect: Mapping[str, Any], talking: list[tuple[int, dict]]) -> list[str]:
    """NCCL prints P2P/CUMEM alike over NVLink and PCIe, and NVLS moves bytes with no Channel
    line at all; the GRAPH line's intra-node path type is what tells them apart."""
    forbid = expect.get("forbid_graph_types") or []
    if not forbid:
        return []
    out = []
    none = [i for i, r in talking if not r.get("graph_types")]
    if none:
        out.append(f"{rank_list(none)} logged no GRAPH line (NCCL_DEBUG_SUBSYS must include GRAPH), "
                   "so the intra-node path type was not checked")
    hit = {i: "/".join(t for t in r.get("graph_types") or [] if t in forbid) for i, r in talking}
    for what, rs in _group({i: v for i, v in hit.items() if v}).items():
        out.append(f"{rank_list(rs)} found intra-node paths of type {what} (NCCL's GRAPH line; "
                   f"not allowed: {', '.join(forbid)})")
    # The GRAPH type is the worst hop a ring may take (search.cc rejects path->type > typeIntra),
    # so a ring over NVLink-bridged pairs prints PXB/SYS; the topology dump lists every link.
    links = expect.get("forbid_gpu_links") or []
    hit = {i: "/".join(t for t in r.get("gpu_links") or [] if t in links) for i, r in talking}
    for what, rs in _group({i: v for i, v in hit.items() if v}).items():
        out.append(f"{rank_list(rs)} see {what} links between GPUs in NCCL's topology, which carry P2P traffic "
                   f"that reads the same as PCIe (not allowed: {', '.join(links)})")
    return out


def _transports(r: dict) -> set[str]:
    return set(r.get("channels") or {}) | set(r.get("received") or {})


def nccl_hints(expect: Mapping[str, Any], ranks: list[dict], env: Mapping[str, str], root=None) -> list[str]:
    """Why it probably happened, from rank 0's host: the HCA list against sysfs, NCCL's own words."""
    from workloads.fabric import preflight

    hints = []
    if not any(r.get("lines") for r in ranks):
        level, subsys = env.get("NCCL_DEBUG"), env.get("NCCL_DEBUG_SUBSYS")
        hints.append(f"NCCL_DEBUG={level or '(unset)'}, NCCL_DEBUG_SUBSYS={subsys or '(unset)'}, "
                     f"NCCL_DEBUG_FILE={env.get('NCCL_DEBUG_FILE') or '(unset: the log went to stdout)'}; "
                     "verification reads NCCL's INFO log (subsystems INIT,NET,GRAPH): unset your NCCL_DEBUG "
                     "overrides or set fabric.verify=warn")
    elif any(r.get("lines") and not r.get("network") for r in ranks) and expect.get("network"):
        hints.append(f"NCCL_DEBUG_SUBSYS={env.get('NCCL_DEBUG_SUBSYS')} must include INIT and NET")
    if any("IB" in (r.get("no_device") or []) for r in ranks):
        hints.append("NCCL said 'NET/IB : No device found'")
    if str(expect.get("network") or "").startswith("IB") and env.get("NCCL_IB_DISABLE") == "1":
        hints.append("NCCL_IB_DISABLE=1 is set")
    if expect.get("link_layer"):
        hints += preflight.check_rdma("?", env, None, preflight.rdma_ports(root))[:1]
    return hints


# ---------------------------------------------------------------------------------------
# Gloo: which interface each rank actually bound, from this process's own sockets


def _hex_addr(h: str) -> tuple[str, int]:
    ip_hex, port_hex = h.split(":")
    raw = bytes.fromhex(ip_hex)
    # /proc prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        ip = socket.inet_ntop(socket.AF_INET, words)
    else:
        ip = socket.inet_ntop(socket.AF_INET6, words)
        if ip.startswith("::ffff:") and "." in ip:
            ip = ip[7:]  # IPv4-mapped
    return ip, int(port_hex, 16)


def socket_table(proc: str = "/proc/self") -> dict:
    """This process's TCP sockets: LISTEN endpoints and ESTABLISHED (local, remote) pairs.
    Only sockets whose inode is one of this process's fds count (the tables are per netns)."""
    inodes = set()
    for fd in glob(f"{proc}/fd/*"):
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    listen, established = [], []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"{proc}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[9] not in inodes:
                continue
            local, remote, state = _hex_addr(f[1]), _hex_addr(f[2]), f[3]
            if state == "0A":
                listen.append(list(local))
            elif state == "01":
                established.append([list(local), list(remote)])
    return {"host": socket.gethostname(), "listen": listen, "established": established,
            "addresses": _addresses_seen_by(proc)}


def _addresses_seen_by(proc: str) -> dict[str, str]:
    """ip -> interface name in the network namespace of process `proc` (another namespace's
    addresses, e.g. an engine rank in an emulated node, are read there with nsenter)."""
    try:
        same = os.readlink(f"{proc}/ns/net") == os.readlink("/proc/self/ns/net")
    except OSError:
        same = True  # cannot tell: this namespace's names are the best guess
    if same:
        return interface_addresses()
    pid = proc.rstrip("/").rsplit("/", 1)[-1]
    try:
        out = subprocess.run(["nsenter", "-t", pid, "-n", "ip", "-o", "addr", "show"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    # "2: emu0    inet 10.77.0.1/24 brd ... scope global emu0\ ..."
    return {f[3].split("/")[0]: f[1] for f in (line.split() for line in out.splitlines())
            if len(f) > 3 and f[2] in ("inet", "inet6")}


def interface_addresses() -> dict[str, str]:
    """ip -> interface name, for this host (IPv4 by ioctl SIOCGIFADDR, IPv6 from /proc)."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                out[socket.inet_ntoa(packed[20:24])] = name
            except OSError:
                pass  # no IPv4 address
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            f = line.split()
            ip = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(f[0]))
            out[ip] = f[5]
    except (OSError, IndexError, ValueError):
        pass
    return out


def gloo_bindings(tables: list[dict], store_port: int | None) -> list[dict]:
    """Per rank, the Gloo peer connections and the interface/address they run over.

    A connection is Gloo's when one end is a Gloo listener: its local end is this rank's
    listening endpoint (the peer connected to us) or its remote end is another rank's
    (we connected to the peer). The rendezvous store's port is left out."""

    def listeners(t):
        return {(ip, port) for ip, port in t["listen"] if port != store_port}

    all_listen = [listeners(t) for t in tables]
    out = []
    for r, t in enumerate(tables):
        mine = all_listen[r]
        mine_ports = {p for ip, p in mine if ip in ("0.0.0.0", "::")}
        others = set().union(*(all_listen[q] for q in range(len(tables)) if q != r)) if len(tables) > 1 else set()
        peers = []
        for (lip, lport), (rip, rport) in t["established"]:
            if store_port in (lport, rport):
                continue
            if (lip, lport) in mine or lport in mine_ports or (rip, rport) in others:
                peers.append((lip, lport, rip, rport))
        addrs = sorted({p[0] for p in peers})
        out.append({
            "rank": r,
            "host": t.get("host"),
            "addresses": addrs,
            "interfaces": sorted({t["addresses"].get(a, "?") for a in addrs}),
            "listen": sorted(f"{ip}:{port}" for ip, port in mine),
            "peer_connections": len(peers),
        })
    return out


def gloo_problems(expect: Mapping[str, Any], bindings: list[dict]) -> list[str]:
    problems = []
    if len(bindings) > 1:
        none = [b["rank"] for b in bindings if not b["peer_connections"]]
        if none:
            problems.append(f"{rank_list(none)}: no Gloo peer connection found among this process's TCP sockets")
    want = expect.get("interfaces")
    if want:
        wrong = {b["rank"]: ", ".join(f"{i}" for i in b["interfaces"])
                 for b in bindings if b["peer_connections"] and not set(b["interfaces"]) <= set(want)}
        for what, rs in _group(wrong).items():
            problems.append(f"{rank_list(rs)} bound {what}, not {', '.join(want)}")
    return problems


# ---------------------------------------------------------------------------------------
# the one call every workload makes


def own_log_path(pattern: str, pid: int | None = None, host: str | None = None) -> Path:
    """NCCL_DEBUG_FILE with NCCL's %h (hostname up to the first dot) and %p (pid) filled in."""
    host = host or socket.gethostname().split(".")[0]
    return Path(pattern.replace("%h", host).replace("%p", str(pid or os.getpid())))


def local_evidence(profile, environ: Mapping[str, str] | None = None) -> dict:
    env = os.environ if environ is None else environ
    if profile.backend == "gloo":
        return {"kind": "gloo", "table": socket_table()}
    pattern = env.get("NCCL_DEBUG_FILE")
    log = nccl_log.ProcessLog()
    if pattern:
        path = own_log_path(pattern)
        if not path.exists():  # e.g. a hostname NCCL shortened differently: any file of this pid
            hits = glob(str(own_log_path(pattern, host="*")))
            path = Path(hits[0]) if hits else path
        if path.exists():
            log = nccl_log.parse_file(path)
        log.file = str(path)
    return {"kind": "nccl", "log": log.as_dict()}


def decide(profile, evidence: list[dict], environ: Mapping[str, str] | None = None, root=None) -> dict:
    """Rank 0's verdict from every rank's evidence (`evidence[r]` is rank r's)."""
    env = os.environ if environ is None else environ
    expect = profile.expect or {}
    if evidence and evidence[0]["kind"] == "gloo":
        port = env.get("MASTER_PORT")
        bindings = gloo_bindings([e["table"] for e in evidence], int(port) if port else None)
        summary = {"backend": "gloo", "network": "Socket",
                   "interfaces": sorted({i for b in bindings for i in b["interfaces"]}), "ranks": bindings,
                   "how": "the TCP connections of each rank's own process (/proc/self/fd + /proc/self/net/tcp*) "
                          "whose end is a Gloo listener; store port excluded"}
        problems = gloo_problems(expect, bindings)
        hints = []
    else:
        ranks = [e["log"] for e in evidence]
        summary = nccl_log.summarize([nccl_log.ProcessLog(**{k: v for k, v in r.items() if k in _PL_FIELDS})
                                      for r in ranks])
        summary["ranks"] = ranks
        problems = nccl_problems(expect, ranks)
        hints = nccl_hints(expect, ranks, env, root) if problems else []
    unverified = bool(problems) and all(any(m in p for m in UNVERIFIED_MARKS) for p in problems)
    message = None
    if problems:
        message = f"fabric={profile.name} but " + "; ".join(problems + hints)
    return {"verdict": "unverified" if unverified else ("mismatch" if problems else "ok"),
            "mode": profile.verify, "message": message, "problems": problems, "hints": hints,
            "expect": dict(expect), "summary": summary}


_PL_FIELDS = set(nccl_log.ProcessLog.__dataclass_fields__)


def check_transport(profile, run_dir, info, environ: Mapping[str, str] | None = None, root=None) -> dict:
    """Call on every rank after the first collective. Returns the verdict dict (same on every
    rank); raises TransportMismatch on every rank when it failed and fabric.verify=fail."""
    if profile.verify == "off":
        return {"verdict": "off", "mode": "off"}
    evidence = local_evidence(profile, environ)
    if info.world_size > 1:
        import torch.distributed as dist

        gathered: list = [None] * info.world_size
        dist.all_gather_object(gathered, evidence)
        result = [decide(profile, gathered, environ, root) if info.is_main else None]
        dist.broadcast_object_list(result, src=0)
        result = result[0]
    else:
        result = decide(profile, [evidence], environ, root)
    result["run_dir"] = str(run_dir)
    if result["message"]:
        if profile.verify == "fail":
            raise TransportMismatch(result["message"] + " (fabric.verify=warn records it and goes on)")
        if info.is_main:
            print(f"warning: {result['message']} (fabric.verify=warn: continuing)", flush=True)
    return result


# The environment variable through which an orchestrator asks a server it started to
# write its own verdict (the reference engine holds the process group, so it can look at
# its Gloo sockets or NCCL log itself).
TRANSPORT_FILE_ENV = "FABRICBENCH_TRANSPORT_FILE"


def report_transport(result: dict, environ: Mapping[str, str] | None = None) -> None:
    """Write a server's verdict where its orchestrator asked for it (rank 0 only)."""
    import json

    target = (os.environ if environ is None else environ).get(TRANSPORT_FILE_ENV)
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(result, default=str))


def server_logs(run_dir, since: float | None = None) -> list[Path]:
    """The NCCL logs of this server's processes: <run_dir>/nccl/*.log written since it started
    (a resumed run reuses its run id, so the logs of earlier servers are there too). One second
    of slack for filesystems with coarse timestamps."""
    logs = sorted(Path(run_dir, "nccl").glob("*.log"))
    if since is None:
        return logs
    return [p for p in logs if p.stat().st_mtime >= since - 1.0]


def process_transport(profile, pids: list[int], world: int) -> dict | None:
    """Gloo verdict for a server whose ranks are other processes (vLLM's workers): the same
    socket-table evidence and rules as `check_transport`, read from /proc/<pid> of each of
    the server's processes; its ranks are those holding a connection to another one's
    listener (the API server and engine core hold none). None when no process is readable."""
    tables = []
    for pid in pids:
        t = socket_table(f"/proc/{pid}")
        if Path(f"/proc/{pid}").exists():
            tables.append(t | {"pid": pid})
    if not tables:
        return None
    ranks = [t for t, b in zip(tables, gloo_bindings(tables, None)) if b["peer_connections"]]
    if len(ranks) > world:
        # Across nodes vLLM's engine core also holds TCP connections to the workers (its
        # message queues to remote readers); its workers are the processes it titles so.
        workers = [t for t in ranks if "Worker" in _title(t["pid"])]
        ranks = workers if len(workers) >= world else ranks
    evidence = [{"kind": "gloo", "table": t} for t in (ranks or tables[:1])]
    result = decide(profile, evidence, {})
    # The fabric's variables as each rank process holds them (did they reach vLLM's workers?).
    unset = {}
    for b, t in zip(result["summary"]["ranks"], ranks):
        b["pid"], b["env"] = t["pid"], process_env(t["pid"], profile.env)
        unset |= {k: v for k, v in profile.env.items() if v is not None and b["env"].get(k) != v}
    result["summary"]["how"] = ("the TCP connections of the server's processes (/proc/<pid>/fd + /proc/<pid>/net/tcp*) "
                                "whose end is another one's listener")
    if unset:
        result["verdict"] = "mismatch"
        result["problems"].append("the server's ranks lack the fabric's " +
                                  ", ".join(f"{k}={v}" for k, v in sorted(unset.items())))
    if world > 1 and len(ranks) < world:
        result["verdict"] = "unverified" if result["verdict"] != "mismatch" else "mismatch"
        result["problems"].insert(0, f"Gloo peer connections found in {len(ranks)} of the server's processes, "
                                     f"not its {world} ranks (pids {', '.join(map(str, pids))})")
    if result["problems"]:
        result["message"] = f"fabric={profile.name} but " + "; ".join(result["problems"] + result["hints"])
    return result


def _title(pid: int) -> str:
    """The process's title (vLLM sets one per role: VLLM::EngineCore, VLLM::Worker_TP0, ...)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def process_env(pid: int, keys) -> dict[str, str | None]:
    """`keys` as they are in the environment of process `pid` (None: not set)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
    return {k: env.get(k) for k in keys}


def server_transport(profile, run_dir, reported: Path | None = None, ranks: int | None = None,
                     since: float | None = None, pids: list[int] | None = None) -> dict:
    """The verdict for a server that runs in other processes: its own report when it wrote
    one; else, on Gloo, the sockets of its processes `pids` (vLLM on CPU); else the NCCL INFO
    logs its processes wrote under <run_dir>/nccl since `since` (SGLang, vLLM); else
    "unverified" (an external server, or no log). `ranks` (the TP degree x nodes' share) is
    how many ranks there must be evidence of: fewer means some workers were not seen, and
    what was not seen is not verified."""
    import json

    if profile.verify == "off":
        return {"verdict": "off", "mode": "off"}
    if reported is not None and reported.is_file():
        return json.loads(reported.read_text())
    if profile.backend == "gloo" and pids:
        result = process_transport(profile, pids, ranks or 1)
        if result is not None:
            result["run_dir"] = str(run_dir)
            return result
    if profile.backend == "nccl":
        logs = [nccl_log.parse_file(p) for p in server_logs(run_dir, since)]
        logs = [lg for lg in logs if lg.lines]  # e.g. an API-server process that loaded NCCL and never used it
        logs.sort(key=lambda lg: (lg.rank is None, lg.rank or 0, lg.file or ""))  # the summary in rank order
        if logs:
            result = decide(profile, [{"kind": "nccl", "log": lg.as_dict()} for lg in logs])
            if ranks is not None and len(logs) < ranks:
                _add_problem(result, profile, f"{len(logs)} of {ranks} rank log(s) under {Path(run_dir, 'nccl')}: "
                                              f"{ranks - len(logs)} rank log(s) missing (workers on other nodes "
                                              "must run with the same fabric profile: launch/slurm/serve_node.sh)")
            result["run_dir"] = str(run_dir)
            return result
    why = (f"no evidence of the server's transport (no report, no NCCL log under {Path(run_dir, 'nccl')}); "
           "an external server is never verified")
    return {"verdict": "unverified", "mode": profile.verify, "message": why, "problems": [why], "hints": [],
            "expect": dict(profile.expect or {}), "summary": {}}


def _add_problem(result: dict, profile, problem: str) -> None:
    """Add one problem to a decided verdict and recompute its verdict and message."""
    problems = result["problems"] + [problem]
    unverified = all(any(m in p for m in UNVERIFIED_MARKS) for p in problems)
    result.update(problems=problems, verdict="unverified" if unverified else "mismatch",
                  message=f"fabric={profile.name} but " + "; ".join(problems + result["hints"]))
