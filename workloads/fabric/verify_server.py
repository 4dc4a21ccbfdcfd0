"""The verdict for a server whose ranks run in other processes than the one that asks.

    result = server_transport(profile, run_dir, reported=..., ranks=tp, since=started, pids=server.pids())

A server that holds its own process group (the reference engine) verifies itself with
verify.check_transport and writes the result where its orchestrator asked
(`report_transport`, through FABRICBENCH_TRANSPORT_FILE). For any other server the
orchestrator gathers the evidence itself: on Gloo the sockets of the server's processes
(/proc/<pid>, procnet.py), on NCCL the INFO logs they wrote under <run_dir>/nccl; the rules
are verify.py's. What it cannot see is "unverified", never "ok".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

from workloads.fabric import nccl_log
from workloads.fabric.procnet import process_env, process_title, socket_table
from workloads.fabric.verify import assess, gloo_bindings, mismatch, unverified, verdict

# The environment variable through which an orchestrator asks a server it started to
# write its own verdict (the reference engine holds the process group, so it can look at
# its Gloo sockets or NCCL log itself).
TRANSPORT_FILE_ENV = "FABRICBENCH_TRANSPORT_FILE"


def report_transport(result: dict, environ: Mapping[str, str] | None = None) -> None:
    """Write a server's verdict where its orchestrator asked for it (rank 0 only)."""
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
        workers = [t for t in ranks if "Worker" in process_title(t["pid"])]
        ranks = workers if len(workers) >= world else ranks
    evidence = [{"kind": "gloo", "table": t} for t in (ranks or tables[:1])]
    problems, hints, summary = assess(profile, evidence, {})
    # The fabric's variables as each rank process holds them (did they reach vLLM's workers?).
    unset = {}
    for b, t in zip(summary["ranks"], ranks):
        b["pid"], b["env"] = t["pid"], process_env(t["pid"], profile.env)
        unset |= {k: v for k, v in profile.env.items() if v is not None and b["env"].get(k) != v}
    summary["how"] = ("the TCP connections of the server's processes (/proc/<pid>/fd + /proc/<pid>/net/tcp*) "
                      "whose end is another one's listener")
    if unset:
        problems.append(mismatch("the server's ranks lack the fabric's " +
                                 ", ".join(f"{k}={v}" for k, v in sorted(unset.items()))))
    if world > 1 and len(ranks) < world:
        problems.insert(0, unverified(f"Gloo peer connections found in {len(ranks)} of the server's processes, "
                                      f"not its {world} ranks (pids {', '.join(map(str, pids))})"))
    return verdict(profile, problems, hints, summary)


def server_transport(profile, run_dir, reported: Path | None = None, ranks: int | None = None,
                     since: float | None = None, pids: list[int] | None = None) -> dict:
    """The verdict for a server that runs in other processes: its own report when it wrote
    one; else, on Gloo, the sockets of its processes `pids` (vLLM on CPU); else the NCCL INFO
    logs its processes wrote under <run_dir>/nccl since `since` (SGLang, vLLM); else
    "unverified" (an external server, or no log). `ranks` (the TP degree x nodes' share) is
    how many ranks there must be evidence of: fewer means some workers were not seen, and
    what was not seen is not verified."""
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
            problems, hints, summary = assess(profile, [{"kind": "nccl", "log": lg.as_dict()} for lg in logs])
            if ranks is not None and len(logs) < ranks:
                problems.append(unverified(f"{len(logs)} of {ranks} rank log(s) under {Path(run_dir, 'nccl')}: "
                                           f"{ranks - len(logs)} rank log(s) missing (workers on other nodes "
                                           "must run with the same fabric profile: launch/slurm/serve_node.sh)"))
            result = verdict(profile, problems, hints, summary)
            result["run_dir"] = str(run_dir)
            return result
    why = (f"no evidence of the server's transport (no report, no NCCL log under {Path(run_dir, 'nccl')}); "
           "an external server is never verified")
    return {"verdict": "unverified", "mode": profile.verify, "message": why, "problems": [why], "hints": [],
            "expect": dict(profile.expect or {}), "summary": {}}
