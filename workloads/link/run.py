"""The link workload: what the wire gives before any framework, on the fabric's own path.

Two ranks, one per node: rank 0 starts the tool's server on its node's fabric interface, rank 1
runs the client against that address, so the bytes cross the link between the nodes (under
launch/emulate.py, the shaped veth between two namespaces). The process group carries only
the coordination: the addresses, "the server listens", the client's output, the verdict.
Rank 0 parses, keeps the tool's raw output beside the record and writes the record.

Every wait has a deadline: the server must listen within link.server_timeout_s, the client
must end within its run time plus a margin, and the server must end soon after the client
(iperf3 -s -1 serves one test). A tool that fails says so in its own words, in one line.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from workloads import session
from workloads.core import dist as fdist
from workloads.core.errors import Fault, UsageError
from workloads.core.fingerprint import fingerprint
from workloads.core.signals import stop_group
from workloads.fabric import leafspine, procnet
from workloads.fabric.profile import FabricProfile
from workloads.link.tools import TOOLS, Options, Tool, ToolFailed, rdma_devices

CLIENT_MARGIN_S = 30.0   # a client's connect, handshake and results exchange, beyond its test time
SERVER_END_S = 15.0      # how long the server may take to end after its client did
DIRECTIONS = ("forward", "reverse", "bidir")


class LinkFailed(Fault):
    """The tool ran and failed (refused, timed out, said "error"): recorded, exit 1. Every rank
    raises it with the same message (it was agreed over the group), so rank 0 alone says it."""

    agreed = True


def settings(cfg: DictConfig) -> Options:
    b = session.section(cfg, "link")
    known = {f.name for f in dataclasses.fields(Options)}
    o = Options(**{k: v for k, v in b.items() if k in known and v is not None})
    if o.tool not in TOOLS:
        raise UsageError(f"link.tool={o.tool!r}; use one of {', '.join(TOOLS)}")
    if o.direction not in DIRECTIONS:
        raise UsageError(f"link.direction={o.direction!r}; use one of {', '.join(DIRECTIONS)}")
    if o.window is not None and not str(o.window).rstrip("KMGkmg").isdigit():
        raise UsageError(f"link.window={o.window!r}; use bytes with an optional K/M/G, e.g. 4M (or null)")
    return o


@dataclasses.dataclass(frozen=True)
class LinkPlan:
    """One link test, checked once before any rank starts; everything below the entry
    function reads this, never the Hydra config."""

    options: Options
    fabric: FabricProfile
    tool: Tool
    interface: str            # the interface the test runs over (interface())
    server_timeout_s: float   # link.server_timeout_s: the server must listen within this
    run: session.RunContext


def validate(cfg: DictConfig, world: int) -> LinkPlan:
    """Everything checkable before a process group exists. Raises UsageError. The fabric's
    backend is not checked: the tools carry the traffic, and the ranks coordinate over Gloo
    (run_link), so a GPU fabric's profile runs on hosts without a GPU free, or without one at all."""
    fabric = session.prepare(cfg, backend=False)
    o = settings(cfg)
    tool = TOOLS[o.tool]
    if world != 2:
        raise UsageError(f"the link workload measures one path between two ranks (server and client), not {world}; "
                         "run 2 ranks, one per node (launch/emulate.py with 2 nodes; torchrun --nnodes=2 "
                         "--nproc_per_node=1)")
    if tool.rdma and not rdma_devices():
        raise UsageError(f"link.tool={tool.name} needs an RDMA device and /sys/class/infiniband lists none on this "
                         "host; run it on InfiniBand/RoCE nodes, or use link.tool=iperf3 for TCP")
    if shutil.which(tool.name) is None:
        raise UsageError(f"{tool.name} is not installed (or not on PATH); install it on every node: "
                         f"apt-get install {tool.package}")
    run_s = tool.run_s(o) + CLIENT_MARGIN_S + SERVER_END_S
    if run_s >= float(cfg.dist.timeout_s):
        raise UsageError(f"a {tool.run_s(o):g} s link test needs dist.timeout_s above {run_s:g} (the other rank waits "
                         f"in a collective meanwhile), but it is {cfg.dist.timeout_s}; raise dist.timeout_s or shorten "
                         "link.duration_s")
    return LinkPlan(o, fabric, tool, interface(fabric, cfg.link.get("interface")), float(cfg.link.server_timeout_s),
                    session.context(cfg))


def interface(fabric: FabricProfile, chosen: str | None) -> str:
    """The interface the test runs over: `chosen` (link.interface), else the one the fabric's sockets use."""
    name = chosen or fabric.env.get("GLOO_SOCKET_IFNAME") or fabric.env.get("NCCL_SOCKET_IFNAME")
    if not name or "," in str(name) or str(name).startswith(("^", "=")):
        raise UsageError(f"fabric={fabric.name} names no single socket interface (GLOO_SOCKET_IFNAME/"
                         f"NCCL_SOCKET_IFNAME is {name!r}); set link.interface=<iface> on both nodes")
    return str(name)


def ipv4_of(iface: str) -> str | None:
    """The interface's IPv4 address, or None when it has none."""
    return next((ip for ip, name in procnet.interface_addresses().items() if name == iface and "." in ip), None)


def listening(port: int, pid: int) -> bool:
    """Process `pid` holds a socket in LISTEN on `port` (any address), in this network namespace."""
    mine = procnet.socket_inodes(f"/proc/{pid}")
    return any(state == procnet.TCP_LISTEN and local[1] == port and inode in mine
               for local, _, state, inode in procnet.tcp_sockets())


def start_server(tool: Tool, o: Options, bind: str, timeout_s: float) -> subprocess.Popen:
    """The tool's server, listening: its own socket seen in LISTEN on the port (so another
    program's listener on the port does not pass for it). ToolFailed, with the server
    stopped, when the port is taken, it exits, or it does not listen in time."""
    if holders := procnet.listeners(o.port):
        who = ", ".join(f"pid {pid} ({procnet.process_title(pid) or '?'})" for pid in holders)
        raise ToolFailed(f"port {o.port} is in use on node 0 ({bind}): {who} listens there; "
                         "set link.port= to a free port")
    p = subprocess.Popen(tool.server_argv(o, bind), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if p.poll() is not None:
            out, err = p.communicate()
            raise ToolFailed(f"{tool.name} server exited ({p.returncode}) before listening on {bind}:{o.port}: "
                             f"{_said(tool, out, err)}")
        if listening(o.port, p.pid):
            return p
        time.sleep(0.05)
    stop(p)
    raise ToolFailed(f"{tool.name} server did not listen on {bind}:{o.port} within {timeout_s:g} s "
                     "(link.server_timeout_s)")


def _said(tool: Tool, out: str, err: str) -> str:
    """The tool's own words for a failure, on one line."""
    if tool.name == "iperf3":
        try:
            tool.parse(out)
        except ToolFailed as e:
            return str(e)
        except Exception:  # noqa: BLE001 - any other shape: fall back to its text
            pass
    text = " ".join((err or out or "no output").split())
    return text[:300]


def stop(p: subprocess.Popen) -> None:
    """Stop a server we started (its own session: the tool's children go with it)."""
    stop_group(p)


def run_client(tool: Tool, o: Options, server: str) -> dict[str, Any]:
    """The client's run: {"stdout", "error"}; error None when the tool measured."""
    timeout = tool.run_s(o) + CLIENT_MARGIN_S
    try:
        p = subprocess.run(tool.client_argv(o, server), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"stdout": "", "error": f"{tool.name} client did not finish within {timeout:g} s"}
    try:
        result = tool.parse(p.stdout)
    except ToolFailed as e:
        return {"stdout": p.stdout, "error": f"{e}" + (f" (exit {p.returncode}: {_said(tool, '', p.stderr)})"
                                                        if p.returncode and p.stderr.strip() else "")}
    # iperf3 stopped by a signal still prints a whole JSON document, of the seconds it ran: a
    # test cut short is not the measurement asked for
    if "seconds" in result and result["seconds"] < 0.9 * o.duration_s:
        return {"stdout": p.stdout, "error": f"{tool.name} measured {result['seconds']:.3g} s of the "
                                             f"{o.duration_s:g} s asked (stopped early)"}
    return {"stdout": p.stdout, "error": None}


def finish_server(p: subprocess.Popen, client_ok: bool) -> str:
    """The server's output: it ends by itself after a test it served; otherwise it is stopped."""
    if client_ok:
        try:
            return p.communicate(timeout=SERVER_END_S)[0]
        except subprocess.TimeoutExpired:
            pass
    stop(p)
    return p.communicate()[0] if p.stdout and not p.stdout.closed else ""


def run_link(cfg: DictConfig, overrides: list[str] | None = None) -> Path | None:
    """One link test. Returns the record path on rank 0, None elsewhere."""
    from workloads.fabric import linerate

    _, world, _, _ = fdist.launch_env()
    plan = validate(cfg, world)
    o, fabric, tool, iface, run = plan.options, plan.fabric, plan.tool, plan.interface, plan.run
    # Gloo whatever the fabric's backend: the process group carries a few small objects, never
    # the measured bytes, and NCCL would need (and occupy) a GPU per rank for them
    info, run_dir, applied_env = session.start(run, dataclasses.replace(fabric, backend="gloo"))
    mine = {"addr": ipv4_of(iface), "rate": linerate.node_line_rate([f"net:{iface}"], fabric.emulate)}
    record = session.base_record(
        "link", run, fabric, applied_env, run_dir.name, overrides,
        world={"world_size": info.world_size, "nodes": info.nodes, "local_world_size": info.local_world_size},
        link=dataclasses.asdict(o) | {"interface": iface, "coordination": "gloo"},
        fingerprint=fingerprint(),
        metrics={},
    )
    stem = f"link-{tool.name}-{fabric.name}-{o.direction}"

    def measure() -> None:
        server = None
        try:
            nodes = _all(mine)
            for r, n in enumerate(nodes):
                if n["addr"] is None:
                    raise UsageError(f"interface {iface} has no IPv4 address on rank {r}'s node; set link.interface= "
                                     "to the fabric's interface")
            addr = nodes[0]["addr"]
            record["link"] |= {"server": f"{addr}:{o.port}", "client": nodes[1]["addr"]}
            failed = None
            if info.is_main:
                try:
                    server = start_server(tool, o, addr, plan.server_timeout_s)
                except ToolFailed as e:
                    failed = str(e)
            failed, _ = fdist.agree(failed, info)
            if failed:
                raise LinkFailed(failed)
            spines = leafspine.read_paths() if info.is_main else None  # an emulated leaf-spine's ECMP paths
            client = run_client(tool, o, addr) if info.rank == 1 else None
            client = _all(client)[1]
            if spines is not None:
                record["paths"] = leafspine.summarize_paths(spines, leafspine.read_paths())
                for key, line in leafspine.path_rows(record["paths"]):
                    print(f"  {key:<15} {line}", flush=True)
            if info.is_main:
                server_out = finish_server(server, client["error"] is None)
                _keep(run_dir, record, tool, client["stdout"], server_out)
            if client["error"]:
                raise LinkFailed(client["error"])
            if info.is_main:
                _measured(record, tool, tool.parse(client["stdout"]), [n["rate"] for n in nodes], info)
        finally:
            if server is not None:  # whatever happened; its output is already kept (finish_server)
                stop(server)

    return session.run_point(session.Point(record, run_dir / "records", stem, info), measure, run.tracking)


def _all(value):
    """Every rank's `value`, in rank order (one small all_gather_object)."""
    import torch.distributed as dist

    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, value)
    return got


def _keep(run_dir: Path, record: dict, tool: Tool, client: str, server: str) -> None:
    """The tool's own output beside the records, named in the record: the figures can be
    read again from what the tool printed, not only from our summary of it."""
    d = run_dir / "link"
    d.mkdir(parents=True, exist_ok=True)
    ext = "json" if tool.name == "iperf3" else "txt"
    tag = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    record["link"]["raw"] = {}
    for side, text in (("client", client), ("server", server)):
        if text:
            p = d / f"{tool.name}-{tag}-{side}.{ext}"
            p.write_text(text)
            record["link"]["raw"][side] = str(p)


def _measured(record: dict, tool: Tool, result: dict, rates: list[dict], info) -> None:
    """The parsed result, the line rate of the path and the record's metrics; one summary line."""
    from workloads.fabric import linerate

    job = linerate.job_line_rate(rates, 1)
    if info.nodes < 2:
        job["scope"] = "one node: the test's bytes do not cross these rails, so the line rate is not compared"
    record["line_rate"] = job
    record["link"]["result"] = result
    line = None if info.nodes < 2 or job["per_node(GB/s)"] is None else job["per_node(GB/s)"] * 8
    payload = None if line is None or job["payload_per_comm(GB/s)"] is None else job["payload_per_comm(GB/s)"] * 8
    record["metrics"] = metrics(result, line, payload)
    print(summary(tool.name, record["metrics"], record["link"]), flush=True)


def metrics(result: dict, line: float | None, payload: float | None) -> dict[str, Any]:
    """The record's headline numbers (docs/metrics.md, "Raw link"); keys carry units.

    iperf3: throughput_received(Gbit/s) is what arrived (the primary figure; what a framework on
    this path could at best move), throughput_sent(Gbit/s) what the sender pushed; %line and
    %payload compare the received throughput with the path's line rate and, on an emulated link,
    its TCP payload ceiling (rate × (MTU − 52)/(MTU + 14), workloads/fabric/linerate.py).
    perftest: its own figures, in Gbit/s and µs."""
    from workloads.fabric.linerate import pct

    if "received(Gbit/s)" not in result:  # perftest
        out = {k: v for k, v in result.items() if "(" in k and k != "size(B)"}
        bw = out.get("bw_average(Gbit/s)")
        if bw is not None and line:
            out["bw_average(%line)"] = pct(bw, line)
        return out
    out = _iperf3_metrics(result, line, payload)
    rev = result.get("bidir_reverse")
    if rev:
        out |= {f"reverse/{k}": v for k, v in _iperf3_metrics(rev, line, payload).items() if "_rate(" not in k}
    return out


def _iperf3_metrics(r: dict, line: float | None, payload: float | None) -> dict[str, Any]:
    from workloads.fabric.linerate import pct

    out = {"throughput_sent(Gbit/s)": r["sent(Gbit/s)"], "throughput_received(Gbit/s)": r["received(Gbit/s)"],
           "retransmits": r["retransmits"], "bytes_received": r["bytes_received"], "duration(s)": r["seconds"]}
    if line:
        out |= {"line_rate(Gbit/s)": line, "throughput(%line)": pct(r["received(Gbit/s)"], line)}
    if payload:
        out |= {"payload_rate(Gbit/s)": payload, "throughput(%payload)": pct(r["received(Gbit/s)"], payload)}
    return out


def summary(name: str, m: dict, link: dict) -> str:
    """One printed line: the figure, and its share of what the path could carry."""
    where = f"{link.get('client')} -> {link.get('server')}"
    if "throughput_received(Gbit/s)" in m:
        text = (f"link {name} {where}: received {m['throughput_received(Gbit/s)']:.4g} Gbit/s, sent "
                f"{m['throughput_sent(Gbit/s)']:.4g} Gbit/s, retransmits {m['retransmits']}")
        if "throughput(%payload)" in m:
            text += (f"; {m['throughput(%payload)']:.1f}% of the TCP payload rate {m['payload_rate(Gbit/s)']:.4g} "
                     f"Gbit/s ({m['throughput(%line)']:.1f}% of the line rate {m['line_rate(Gbit/s)']:.4g})")
        elif "throughput(%line)" in m:
            text += f"; {m['throughput(%line)']:.1f}% of the line rate {m['line_rate(Gbit/s)']:.4g} Gbit/s"
        if "reverse/throughput_received(Gbit/s)" in m:
            text += f"; reverse received {m['reverse/throughput_received(Gbit/s)']:.4g} Gbit/s"
        return text
    figures = ", ".join(f"{k} {v:g}" for k, v in m.items() if isinstance(v, (int, float)))
    return f"link {name} {where}: {figures}"
