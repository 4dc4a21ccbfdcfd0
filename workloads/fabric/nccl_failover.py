"""What NCCL itself said about a failure: its IB port failover lines and a RAS status report.

NCCL >= 2.29.7 can move a connection off a failed IB port (NCCL_IB_RESILIENCY_PORT_FAILOVER=1);
its lines are written by src/transport/net_ib/p2p_resiliency.cc (the same strings in 2.29.7-1 and
2.30.7-1):

    WARN("NET/IB: Device %d marked as failed. Initiating recovery? %s (%s comm=%p, outstandingRecovery=%d)")
    INFO(NCCL_NET, "NET/IB: %s: Marking device %d as permanently failed (%s comm=%p)")
    INFO(NCCL_NET, "NET/IB: %s: The error is not fatal. Trying to continue...")
    WARN("NET/IB: The error is fatal (%s). Cannot continue.")
    WARN("NET/IB: Fatal error. Detected %d failed devices out of %d devices on the %s communicator (comm=%p). ...")

The RAS client (`ncclras`, src/ras/client_support.cc, 2.29.7-1 and 2.30.7-1) prints a
communicators table under the header "Group     Comms     Nodes     Ranks     Ranks     Ranks
Status  Errors", one row per group as "%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s" (group, comms in
it, nodes per comm, ranks per node, ranks per comm, ranks in group, status from
{NOCOMM, INIT, RUNNING, FINALIZE, ABORT}, errors from {OK, MISMATCH, ERROR, INCOMPLETE, ...}),
then an "Errors" section whose entries start with a word in capitals (INCOMPLETE, DEAD, ...).

`failover(text)` and `ras(text)` read them; `in_run(run_dir)` reads a run's NCCL logs
(<run dir>/nccl/*.log, workloads/fabric/profile.py) and any `ras*.txt` saved beside them.
"""

from __future__ import annotations

import re
from pathlib import Path

_FAILED = re.compile(r"NET/IB: Device (?P<dev>\d+) marked as failed\. Initiating recovery\? (?P<recovery>Yes|No) "
                     r"\((?P<side>send|recv) comm=(?P<comm>\S+), outstandingRecovery=(?P<outstanding>\d+)\)")
_PERMANENT = re.compile(r"NET/IB: \w+: Marking device (?P<dev>\d+) as permanently failed \((?P<side>send|recv) "
                        r"comm=(?P<comm>[^)\s]+)\)")
_CONTINUE = re.compile(r"NET/IB: \w+: The error is not fatal\. Trying to continue\.\.\.")
_FATAL = re.compile(r"NET/IB: The error is fatal \((?P<reason>[^)]*)\)\. Cannot continue\.")
_MANY = re.compile(r"NET/IB: Fatal error\. Detected (?P<failed>\d+) failed devices out of (?P<devs>\d+) devices on "
                   r"the (?P<side>send|recv) communicator")
_PREFIX = re.compile(r"^(?P<host>[^:\s]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<gpu>\d+)\] NCCL (?:WARN|INFO) ")
RAS_HEAD = "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors"
_RAS_ROW = re.compile(r"^\s*(?P<group>\d+)\s+(?P<comms>\d+)\s+(?P<nodes>\d+)\s+(?P<per_node>\d+(?:-\d+)?)\s+"
                      r"(?P<per_comm>\d+)\s+(?P<in_group>\d+)\s+(?P<status>[A-Z]+)\s+(?P<errors>[A-Z,]+)\s*$")


def failover(text: str) -> dict:
    """Counts and events of NCCL's IB port-failover lines in one log's text."""
    events = []
    for line in text.splitlines():
        m = _PREFIX.match(line)
        where = {"host": m["host"], "pid": int(m["pid"])} if m else {}
        if f := _FAILED.search(line):
            events.append({"event": "device_failed", "device": int(f["dev"]), "recovery": f["recovery"] == "Yes",
                           "side": f["side"], **where})
        elif f := _PERMANENT.search(line):
            events.append({"event": "permanently_failed", "device": int(f["dev"]), "side": f["side"], **where})
        elif _CONTINUE.search(line):
            events.append({"event": "continued", **where})
        elif f := _FATAL.search(line):
            events.append({"event": "fatal", "reason": f["reason"], **where})
        elif f := _MANY.search(line):
            events.append({"event": "fatal", "reason": f"{f['failed']} of {f['devs']} devices failed", **where})
    kinds = [e["event"] for e in events]
    return {"events": events, "devices_failed": kinds.count("device_failed"),
            "recovered": kinds.count("device_failed") > 0 and "fatal" not in kinds and "permanently_failed" not in kinds,
            "fatal": "fatal" in kinds}


def ras(text: str) -> dict | None:
    """The communicators table and the error entries of one `ncclras` report; None without one."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(RAS_HEAD))
    except StopIteration:
        return None
    groups = []
    for line in lines[start + 2:]:
        m = _RAS_ROW.match(line)
        if not m:
            break
        g = m.groupdict()
        groups.append({k: (v if k in ("per_node", "status", "errors") else int(v)) for k, v in g.items()})
    errors, in_errors = [], False
    for line in lines[start:]:
        if line.strip() == "Errors":
            in_errors = True
        elif in_errors and re.match(r"^[A-Z]{3,}\b", line):
            errors.append(line.strip())
    return {"groups": groups, "errors": errors, "ok": bool(groups) and not errors
            and all(g["status"] == "RUNNING" and g["errors"] == "OK" for g in groups)}


def stamp(rec: dict, run_dir: str | Path) -> None:
    """The record's `nccl_failover`, when NCCL logged a failover or a RAS report lies in the run's
    folder (this host's logs: each node's lines stay on its node)."""
    if (seen := in_run(run_dir)) is not None:
        rec["nccl_failover"] = seen


def in_run(run_dir: str | Path) -> dict | None:
    """NCCL's own account of a failure in a run: every log's failover lines, and each RAS report
    saved as <run dir>/nccl/ras*.txt (`ncclras > ...` on a stall); None when NCCL wrote none."""
    d = Path(run_dir) / "nccl"
    if not d.is_dir():
        return None
    logs = {p.name: failover(p.read_text(errors="replace")) for p in sorted(d.glob("*.log"))}
    reports = {p.name: r for p in sorted(d.glob("ras*.txt")) if (r := ras(p.read_text(errors="replace"))) is not None}
    logs = {k: v for k, v in logs.items() if v["events"]}
    if not logs and not reports:
        return None
    return {"failover": logs, "ras": reports,
            "devices_failed": sum(v["devices_failed"] for v in logs.values()),
            "fatal": any(v["fatal"] for v in logs.values())}
