"""Concurrent jobs on one emulated fabric: K jobs on disjoint nodes that share its links.

    python launch/emulate.py --jobs 2 launch/collectives.py fabric=emu-leafspine

Job j gets nodes j, j+K, j+2K, ...: on a leaf-spine that is one host per leaf per job (for
nodes = K x leaves), so every job's traffic between its nodes crosses the spines the others use.
Each job is its own torchrun world (its own rendezvous on its first node, its own run id
`<run id>-job<j>`), all started together. What a shared cluster's users feel:

- JCT (job completion time): seconds from the moment the emulator starts a job's agents to the
  moment its last agent exits: start-up, rendezvous, the measurement and the teardown, as a
  scheduler sees a job;
- each job's primary metric (the catalog's, from its record), and Jain's fairness index over the
  jobs' primary metrics, (Σx)² / (K·Σx²): 1 when the fabric shared itself evenly, 1/K when one
  job got everything.

The summary is printed and written to `<output_root>/jobs-<tag>.json` beside the jobs' run
folders; the records themselves are each job's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from workloads import catalog
from workloads.core.errors import UsageError
from workloads.core.records import iter_records


def split(nodes: int, jobs: int) -> list[list[int]]:
    if jobs < 1 or nodes % jobs or nodes // jobs < 2:
        raise UsageError(f"--jobs {jobs} cannot split {nodes} emulated nodes into jobs of 2 or more nodes each; "
                         f"use a --jobs that divides {nodes} and leaves each job >= 2 nodes")
    return [list(range(j, nodes, jobs)) for j in range(jobs)]


def job_overrides(overrides: Sequence[str], job: int) -> tuple[list[str], str | None]:
    """Each job's overrides and, when the user named the run, its run id: `<run_id>-job<j>` (two
    jobs in one run folder would take each other's records for duplicates)."""
    out, run_id = [], None
    for o in overrides:
        if o.startswith("run_id="):
            run_id = f"{o.split('=', 1)[1]}-job{job}"
            o = f"run_id={run_id}"
        out.append(o)
    return out, run_id


def summarize(jobs: list[dict]) -> dict:
    """`jobs`: per job {job, nodes, run_id, exit_code, jct_s, metric, value}; adds Jain over values."""
    from workloads.fabric.nic import jain_index

    values = [j["value"] for j in jobs]
    ok = all(v is not None for v in values)
    return {
        "jobs": jobs,
        "metric": jobs[0]["metric"] if jobs and len({j["metric"] for j in jobs}) == 1 else None,
        "jain_index": jain_index(values) if ok else None,
        "jct_s": {"max": max(j["jct_s"] for j in jobs), "min": min(j["jct_s"] for j in jobs)},
    }


def primary_of(run_dir: Path) -> tuple[str | None, float | None, str | None]:
    """(metric, value, status) of the job's one record (its last, for a sweep)."""
    recs = [rec for _, rec in iter_records(run_dir, "records/*.json")]
    if not recs:
        return None, None, None
    rec = recs[-1]
    w = catalog.get(rec.get("workload", ""))
    metric = w.primary((rec.get("metrics") or {}).keys()) if w else None
    value = (rec.get("metrics") or {}).get(metric) if metric else None
    return metric, value, rec.get("status")


def rows(summary: dict) -> list[str]:
    out = [f"{'job':>4}  {'nodes':<10} {'exit':>4} {'JCT(s)':>8}  {'metric':<28} value"]
    for j in summary["jobs"]:
        v = "n/a" if j["value"] is None else f"{j['value']:.6g}"
        out.append(f"{j['job']:>4}  {','.join(map(str, j['nodes'])):<10} {j['exit_code']:>4} {j['jct_s']:>8.2f}  "
                   f"{j['metric'] or 'n/a':<28} {v}")
    jn = summary["jain_index"]
    out.append(f"Jain's fairness over the jobs' {summary['metric'] or 'metric'}: {'n/a' if jn is None else f'{jn:.3f}'}")
    return out


def write(summary: dict, output_root: str, tag: str) -> Path:
    p = Path(output_root) / f"jobs-{tag}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(summary, indent=1) + "\n")
    return p

