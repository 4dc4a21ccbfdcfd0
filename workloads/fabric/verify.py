"""The verdict: did the run use the transport its fabric label claims?

    result = check_transport(profile, run_dir, info)   # every rank calls it, after the first collective

Each rank collects its own evidence (NCCL/RCCL: its own INFO log file; Gloo: the TCP
sockets of this process), all ranks gather it, rank 0 decides against the profile's
`expect:` block and broadcasts the decision, so every rank raises (or not) together.
A mismatch raises `TransportMismatch` with one message unless `fabric.verify=warn`
(printed and recorded) or `off` (not checked). Each rule returns typed `Problem`s; the
verdict (ok / unverified / mismatch) is decided on their kinds, never on their wording.
Servers whose ranks are other processes: verify_server.py; the /proc reading: procnet.py.

`expect:` keys (conf/fabric/*.yaml):
  network            IB | Socket | <plugin name> | null   NCCL's `Using network` (IBext* counts as IB)
  plugin             none | <text>                        the external net plugin the communicator ran on
                                                          (loaded, and not replaced by NCCL's internal IB or
                                                          Socket after its init failed): none = NCCL's own transports only;
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

import os
import socket
from dataclasses import dataclass
from glob import glob
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

from workloads.core.errors import TransportMismatch
from workloads.fabric import nccl_log
from workloads.fabric.procnet import socket_table

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
# problems: what the evidence says against the label, typed


# "unverified": evidence is missing (no log, no channel connected yet, no peer seen), so the label
# is neither confirmed nor refuted (fabric.verify=fail still stops the run, with the reason);
# "mismatch": the evidence contradicts the label.
ProblemKind = Literal["unverified", "mismatch"]


@dataclass(frozen=True)
class Problem:
    """One thing the evidence says about the label. The verdict is decided on `kind`; `text`
    is only for people (it goes into the message and the record)."""
    kind: ProblemKind
    text: str

    def __post_init__(self):
        if self.kind not in get_args(ProblemKind):
            raise ValueError(f"problem kind {self.kind!r} is not one of {get_args(ProblemKind)}")


def unverified(text: str) -> Problem:
    return Problem("unverified", text)


def mismatch(text: str) -> Problem:
    return Problem("mismatch", text)


def verdict_of(problems: list[Problem]) -> str:
    """ok: nothing against the label; unverified: only missing evidence; mismatch: any contradiction."""
    if not problems:
        return "ok"
    return "unverified" if all(p.kind == "unverified" for p in problems) else "mismatch"


# ---------------------------------------------------------------------------------------
# NCCL / RCCL: the verdict from per-rank log summaries (pure)


CHANNEL_RULES = ("forbid_transports", "allow_transports", "gdr")


def nccl_problems(expect: Mapping[str, Any], ranks: list[dict]) -> list[Problem]:
    """`ranks` holds one `ProcessLog.as_dict()` per process. Returns what disagrees with
    `expect`, naming each process by the rank NCCL gave it (its `comm ... rank r` line): a
    server's logs come in file-name order (host, pid), not rank order. The list position
    stands in only for a log that printed no rank."""
    problems = []
    named = [(i if r.get("rank") is None else r["rank"], r) for i, r in enumerate(ranks)]
    silent = [i for i, r in named if not r.get("lines")]
    if silent:
        problems.append(unverified(f"{rank_list(silent)} wrote no NCCL INFO log"))
    talking = [(i, r) for i, r in named if r.get("lines")]
    if any(expect.get(k) for k in CHANNEL_RULES) and len(ranks) > 1:
        # NCCL >= 2.22 connects channels lazily (NCCL_RUNTIME_CONNECT): before a real
        # collective the log holds no "Channel ... via" line and every channel rule would pass
        # on nothing.
        bare = [i for i, r in talking if not _transports(r)]
        if bare:
            problems.append(unverified(f"{rank_list(bare)} logged no channel (no collective had connected one), "
                                       "so the channel rules were not checked"))
    problems += _graph_problems(expect, talking)
    want_net = expect.get("network")
    if want_net:
        actual = {i: ("NET/" + r["network"] if r.get("network") else "no 'Using network' line")
                  for i, r in talking if nccl_log.network_family(r.get("network")) != want_net}
        for what, rs in _group(actual).items():
            problems.append(mismatch(f"{rank_list(rs)} " + ("used " if what.startswith("NET/") else "logged ") + what))
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
            problems.append(mismatch(f"{rank_list(rs)} used {what} (link layer is not {want_link})"))
    for prefix in expect.get("forbid_transports") or []:
        hit = {i: ", ".join(sorted(t for t in _transports(r) if t.startswith(prefix))) for i, r in talking}
        for what, rs in _group({i: v for i, v in hit.items() if v}).items():
            problems.append(mismatch(f"{rank_list(rs)} have channels via {what}"))
    allowed = expect.get("allow_transports")
    if allowed:
        off = {i: ", ".join(sorted(t for t in _transports(r) if not any(t.startswith(a) for a in allowed)))
               for i, r in talking}
        for what, rs in _group({i: v for i, v in off.items() if v}).items():
            problems.append(mismatch(f"{rank_list(rs)} have channels via {what} (allowed: {', '.join(allowed)})"))
    if expect.get("gdr"):
        no_gdr = [i for i, r in talking if r.get("net_channels") and r.get("gdr_channels") != r.get("net_channels")]
        if no_gdr:
            problems.append(mismatch(f"{rank_list(no_gdr)} have NET channels without GPUDirect RDMA (no /GDRDMA)"))
    return problems


def _plugin_problems(want: str | None, talking: list[tuple[int, dict]]) -> list[Problem]:
    """An external net plugin (SHARP's IBext, aws-ofi, Spectrum-X, gIB, ...) replaces NCCL's
    own IB transport with its own code and tuning: a run labelled for one must not run on
    another. `want`: none, or text the plugin's name must contain; absent = not checked. The
    plugin counts only when the communicator ran on it (nccl_log._plugin_in_use): one that
    was loaded and then failed, leaving NCCL's internal IB or Socket, fails the expectation."""
    if want is None:
        return []
    wrong = {}
    for i, r in talking:
        name = r.get("plugin")
        failed = r.get("plugin_failed")
        if str(want).lower() == "none":
            if name:
                wrong[i] = f"loaded net plugin {name!r}" + (f" from {r['plugin_path']}" if r.get("plugin_path") else "")
        elif failed and not name:
            wrong[i] = f"did not run on the net plugin ({failed})"
        elif not name or str(want).lower() not in name.lower():
            wrong[i] = f"loaded {'net plugin ' + repr(name) if name else 'no net plugin'}"
    expected = "none" if str(want).lower() == "none" else f"one named like {want!r}"
    return [mismatch(f"{rank_list(rs)} {what} (expected plugin: {expected})") for what, rs in _group(wrong).items()]


def _graph_problems(expect: Mapping[str, Any], talking: list[tuple[int, dict]]) -> list[Problem]:
    """NCCL prints P2P/CUMEM alike over NVLink and PCIe, and NVLS moves bytes with no Channel
    line at all; the GRAPH line's intra-node path type is what tells them apart."""
    forbid = expect.get("forbid_graph_types") or []
    if not forbid:
        return []
    out = []
    none = [i for i, r in talking if not r.get("graph_types")]
    if none:
        out.append(unverified(f"{rank_list(none)} logged no GRAPH line (NCCL_DEBUG_SUBSYS must include GRAPH), "
                              "so the intra-node path type was not checked"))
    hit = {i: "/".join(t for t in r.get("graph_types") or [] if t in forbid) for i, r in talking}
    for what, rs in _group({i: v for i, v in hit.items() if v}).items():
        out.append(mismatch(f"{rank_list(rs)} found intra-node paths of type {what} (NCCL's GRAPH line; "
                            f"not allowed: {', '.join(forbid)})"))
    # The GRAPH type is the worst hop a ring may take (search.cc rejects path->type > typeIntra),
    # so a ring over NVLink-bridged pairs prints PXB/SYS; the topology dump lists every link.
    links = expect.get("forbid_gpu_links") or []
    hit = {i: "/".join(t for t in r.get("gpu_links") or [] if t in links) for i, r in talking}
    for what, rs in _group({i: v for i, v in hit.items() if v}).items():
        out.append(mismatch(f"{rank_list(rs)} see {what} links between GPUs in NCCL's topology, which carry P2P "
                            f"traffic that reads the same as PCIe (not allowed: {', '.join(links)})"))
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


def gloo_problems(expect: Mapping[str, Any], bindings: list[dict]) -> list[Problem]:
    problems = []
    if len(bindings) > 1:
        none = [b["rank"] for b in bindings if not b["peer_connections"]]
        if none:
            problems.append(unverified(f"{rank_list(none)}: no Gloo peer connection found among this process's TCP sockets"))
    want = expect.get("interfaces")
    if want:
        wrong = {b["rank"]: ", ".join(f"{i}" for i in b["interfaces"])
                 for b in bindings if b["peer_connections"] and not set(b["interfaces"]) <= set(want)}
        for what, rs in _group(wrong).items():
            problems.append(mismatch(f"{rank_list(rs)} bound {what}, not {', '.join(want)}"))
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


def assess(profile, evidence: list[dict], environ: Mapping[str, str] | None = None,
           root=None) -> tuple[list[Problem], list[str], dict]:
    """Rank 0's reading of every rank's evidence (`evidence[r]` is rank r's): the problems,
    the hints (why it probably happened; only when there are problems) and the summary."""
    env = os.environ if environ is None else environ
    expect = profile.expect or {}
    if evidence and evidence[0]["kind"] == "gloo":
        port = env.get("MASTER_PORT")
        bindings = gloo_bindings([e["table"] for e in evidence], int(port) if port else None)
        summary = {"backend": "gloo", "network": "Socket",
                   "interfaces": sorted({i for b in bindings for i in b["interfaces"]}), "ranks": bindings,
                   "how": "the TCP connections of each rank's own process (/proc/self/fd + /proc/self/net/tcp*) "
                          "whose end is a Gloo listener; store port excluded"}
        return gloo_problems(expect, bindings), [], summary
    ranks = [e["log"] for e in evidence]
    summary = nccl_log.summarize([nccl_log.ProcessLog(**{k: v for k, v in r.items() if k in _PL_FIELDS})
                                  for r in ranks])
    summary["ranks"] = ranks
    problems = nccl_problems(expect, ranks)
    return problems, (nccl_hints(expect, ranks, env, root) if problems else []), summary


def verdict(profile, problems: list[Problem], hints: list[str], summary: dict) -> dict:
    """The verdict record (what check_transport returns and the run's record keeps): the
    problems' texts, the verdict decided on their kinds."""
    texts = [p.text for p in problems]
    return {"verdict": verdict_of(problems), "mode": profile.verify,
            "message": f"fabric={profile.name} but " + "; ".join(texts + hints) if problems else None,
            "problems": texts, "hints": hints, "expect": dict(profile.expect or {}), "summary": summary}


def decide(profile, evidence: list[dict], environ: Mapping[str, str] | None = None, root=None) -> dict:
    """Rank 0's verdict from every rank's evidence (`evidence[r]` is rank r's)."""
    return verdict(profile, *assess(profile, evidence, environ, root))


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
