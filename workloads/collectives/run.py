"""The collectives workload: validate, apply the fabric, init, sweep, record.

`run_collectives(cfg)` is called once per sweep point by launch/collectives.py, in the
same order as the training workload (workloads/training/run.py): the fabric's environment is
exported before the process group exists, everything checkable without a process group
is checked first, and one record per run is written by rank 0 even when the run fails.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from workloads import session
from workloads.collectives import ops
from workloads.collectives.harness import Communicators, Harness, Row, min_bw_verdict, summarize
from workloads.collectives.settings import Checks, Settings, Sweep, pattern_groups
from workloads.core import dist as fdist
from workloads.core import hostmem
from workloads.core.errors import Fault, UsageError
from workloads.core.fingerprint import fingerprint
from workloads.fabric import faults
from workloads.fabric.profile import FabricProfile


@dataclass(frozen=True)
class CollectivesPlan:
    """One collectives point, checked once before any rank starts: the collectives: section
    (settings.py), the fabric, and the run's context (session.RunContext). Everything below
    the entry function reads this, never the Hydra config."""

    settings: Settings
    fabric: FabricProfile
    run: session.RunContext


def validate(cfg: DictConfig, world: int) -> CollectivesPlan:
    """Everything checkable before a process group exists. Raises UsageError."""
    fabric = session.prepare(cfg)
    s = Settings.from_config(session.section(cfg, "collectives"), world)
    if s.external.mode == "on" and shutil.which(s.external.binary) is None:
        raise UsageError(f"collectives.external=on but {s.external.binary} is not on PATH; install nccl-tests "
                         "(or rccl-tests) or set collectives.external=auto")
    if fabric.backend == "gloo":  # host memory, shared by this node's ranks; GPUs are checked in the rank
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if (room := hostmem.headroom(shared_by=ranks_here)) is not None:
            check_fits(s, world, room.bytes, f"host memory ({room.where})")
    return CollectivesPlan(s, fabric, session.context(cfg))


def peak_bytes(sweep: Sweep, checks: Checks, world: int) -> tuple[int, str, int]:
    """(bytes one rank holds at once, op, size) for the sweep's largest buffers: send, receive
    and, when checking, the expected values."""
    type_size = ops.DTYPES[sweep.datatype].itemsize
    best = (0, "", 0)
    for name in sweep.ops:
        lay = ops.get(name).layout(max(sweep.sizes), type_size, world)
        need = (lay.send_numel + lay.recv_numel * (2 if checks.elements else 1)) * type_size
        best = max(best, (need, name, max(sweep.sizes)))
    return best


def check_fits(s: Settings, world: int, free: int | None, where: str) -> None:
    """A size that cannot be allocated is found before any timing, in one line."""
    need, op, size = peak_bytes(s.sweep, s.checks, world)
    if free is not None and need > free:
        raise UsageError(f"collectives.maxbytes={size} B ({size / 2**30:g} GiB): {op} needs {need / 2**30:.2f} GiB of buffers per rank but "
                         f"{free / 2**30:.2f} GiB of {where} are free; lower collectives.maxbytes")


def make_comm(groups: list[list[int]], rank: int) -> ops.Comm:
    """Every rank creates every group, in the same order (torch requires it)."""
    mine = None
    for ranks in groups:
        group = None if len(groups) == 1 else dist.new_group(ranks)
        if rank in ranks:
            mine = ops.Comm(group=group, rank=ranks.index(rank), size=len(ranks), global_ranks=tuple(ranks))
    assert mine is not None
    return mine


def run_collectives(cfg: DictConfig, overrides: list[str] | None = None) -> Path | None:
    """Run one sweep. Returns the record path on rank 0, None elsewhere."""
    _, world, _, _ = fdist.launch_env()
    plan = validate(cfg, world)
    s, fabric = plan.settings, plan.fabric
    info, run_dir, applied_env = session.start(plan.run, fabric)
    say = (lambda line: print(line, flush=True)) if info.is_main else None
    rpn = s.grouping.ranks_per_node or info.local_world_size

    record = session.base_record(
        "collectives", plan.run, fabric, applied_env, run_dir.name, overrides,
        world={"world_size": info.world_size, "nodes": info.nodes, "local_world_size": info.local_world_size},
        collectives=s.record_block(rpn),
        fingerprint=fingerprint(),
        metrics={},
        rows=[],
        p2p=[],
        external=None,
    )
    stem = f"collectives-{fabric.name}-{s.grouping.pattern}-n{info.world_size}"
    def measure() -> None:
        _judge(s, _measure(s, fabric, info, run_dir, record, rpn, say), record)

    path = session.run_point(session.Point(record, run_dir / "records", stem, info), measure, plan.run.tracking)
    if record["status"] != "ok":
        fdist.wait_for_writer(info)  # the check and the rates are combined over ranks: all fail here together
        raise CollectivesFailed(record["error"])
    return path


def _measure(s: Settings, fabric: FabricProfile, info: fdist.DistInfo, run_dir: Path, record: dict, rpn: int,
             say) -> list[Row]:
    """Verify the transport, then run every op, the p2p tests and (rank 0) the external
    nccl-tests binary; fill the record's rows and metrics."""
    from workloads.collectives.p2p import run_p2p
    from workloads.fabric import leafspine, linerate, nic
    from workloads.fabric.verify import check_transport

    groups = pattern_groups(s.grouping.pattern, info.world_size, rpn)
    record["collectives"]["groups"] = groups
    comm = make_comm(groups, info.rank)
    if info.device.type == "cuda":  # before any timing: one line naming the size and the free memory
        check_fits(s, info.world_size, torch.cuda.mem_get_info(info.device)[0], f"{info.device} memory")
    harness = Harness(s.sweep, s.timing, s.checks, comm, info.device, fabric.backend, info.rank, say,
                      Communicators(groups, rpn, s.grouping.pattern), s.faults)
    # Transport verification (workloads/fabric/verify.py): after real collectives of a small and a
    # large size on the measured communicator (NCCL >= 2.22 connects channels at first use).
    fdist.warmup_collectives(info.device, comm.group)
    harness.barrier()
    record["fabric"]["transport"] = check_transport(fabric, run_dir, info)
    rails = nic.rails_for(fabric, os.environ, record["fabric"].get("transport"))
    node_rate = linerate.node_line_rate(rails, fabric.emulate)
    harness.line_rate = _line_rate(node_rate, groups, record, info, say)
    sampler = nic.NicSampler(enabled=info.local_rank == 0)  # the whole sweep is one window
    spines = leafspine.read_paths() if info.is_main else None  # an emulated leaf-spine's ECMP paths
    sampler.begin_step()
    if info.rank == 0:
        faults.window_started(time.time())  # a fault schedule counts from the timed sweep
    rows: list[Row] = []
    op_names = s.sweep.ops
    for name in op_names:
        rows += harness.run_op(ops.get(name))
        record["rows"] = [r.as_dict() for r in rows]
    sampler.end_step()
    record["nic"] = nic.gather_summaries(sampler, rails, node_rate["rails"], info)
    if spines is not None:
        record["paths"] = leafspine.summarize_paths(spines, leafspine.read_paths())
    for key, line in [*nic.summary_rows(record["nic"]), *leafspine.path_rows(record.get("paths"))] if say else []:
        say(f"# {key:<20} : {line}")
    if info.is_main:
        _flag_above_line_rate(record, harness.line_rate, info.nodes, run_dir, say)
    p2p = []
    if s.p2p.tests:
        pair = s.p2p.ranks or ((0, info.local_world_size) if info.nodes > 1 else (0, 1))
        p2p = run_p2p(s.p2p, pair, info.rank, info.device, say)
        record["p2p"] = [r.as_dict() for r in p2p]
    record["metrics"] = metrics(rows, op_names) | p2p_metrics(p2p, s.p2p.tests) | line_rate_metrics(
        rows, op_names, harness.line_rate)
    if say and len(op_names) > 1 and rows:
        say(f"# {'Avg bus bandwidth':<20} : {record['metrics']['avg_busbw(GB/s)']:g} over every row of all "
            f"{len(op_names)} ops (fabricbench's avg_busbw(GB/s); nccl-tests reports one per op, above)")
    if info.is_main:
        _ceiling(record, say)
    _external(s, fabric, info, run_dir, record, rpn, say)
    return rows


def _external(s: Settings, fabric: FabricProfile, info: fdist.DistInfo, run_dir: Path, record: dict, rpn: int,
              say) -> None:
    """nccl-tests' own binary on the same sweep, with every other rank idle meanwhile."""
    from workloads.collectives.nccltests import run_external_alone, summary_line

    mode = s.external.mode
    if mode != "off" and (mode == "on" or fabric.backend == "nccl"):
        record["external"] = run_external_alone(s, run_dir / "external", info, rpn)
        if say and (line := summary_line(record["external"])):
            say(line)
    elif info.is_main and mode != "off":
        record["external"] = {"status": "skipped", "reason": "external=auto runs it only on NCCL fabrics"}


def _line_rate(node_rate: dict, groups: list[list[int]], record: dict, info: fdist.DistInfo, say) -> float | None:
    """Every node's line rate over the run's rails (workloads/fabric/linerate.py), gathered
    to rank 0 into record["line_rate"]; returns the GB/s one communicator's busbw is compared
    with on rank 0 of a multi-node run (None elsewhere: one node's traffic never leaves it):
    the node's whole rate when one communicator spans the nodes (pattern all), its share when
    each local rank has its own communicator across nodes (one_per_node, pairs)."""
    from workloads.fabric import linerate, nic

    nodes = nic.gather_from_nodes(node_rate, info)
    if not info.is_main:
        return None
    # Real nodes (torchrun's local world), not collectives.ranks_per_node's emulated ones.
    share = linerate.communicators_per_node(groups, info.local_world_size)
    job = linerate.job_line_rate(nodes, info.local_world_size, share)
    if info.nodes < 2:
        job["scope"] = "one node: its traffic does not cross these rails, so busbw is not compared with them"
    record["line_rate"] = job
    if say:
        say("# " + linerate.describe(job) + ("" if info.nodes > 1 else " (one node: not compared)"))
    return job["per_comm(GB/s)"] if info.nodes > 1 else None


def _ceiling(record: dict, say) -> None:
    """The link rate this machine's class can carry (workloads/fabric/ceiling.py: one GPU's links on
    one node, one communicator's share of the NICs across nodes),
    with its source, and the peak busbw as a share of it: a figure to read against the class,
    not an absolute GB/s. Not a failure: a slow fabric is a result (make gpu-check gates it)."""
    from workloads.fabric.ceiling import all_reduce_ceiling

    c = all_reduce_ceiling(record)
    record["ceiling"] = {"line(GB/s)": c.line_gbps, "band(GB/s)": [c.low_gbps, c.high_gbps], "source": c.source}
    peak = record["metrics"].get("peak_busbw(GB/s)")
    if c.line_gbps and peak is not None:
        record["metrics"]["peak_busbw(%ceiling)"] = 100 * peak / c.line_gbps
    if say:
        share = f"peak busbw {record['metrics']['peak_busbw(%ceiling)']:.0f}% of " if c.line_gbps and peak else ""
        say(f"# {'Class ceiling':<20} : {share}{c.line_gbps or 'n/a'}"
            f"{' GB/s' if c.line_gbps else ''} ({c.source})")


def _flag_above_line_rate(record: dict, per_comm: float | None, nodes: int, run_dir: Path, say) -> None:
    """A busbw above one communicator's physical rate across nodes: name NCCL's algorithm and the remedy."""
    from workloads.fabric import linerate

    if "line_rate" not in record:
        return
    logs = run_dir / "nccl"
    flags = linerate.above_line_rate(record["rows"], per_comm, nodes, linerate.algorithms_in(logs),
                                     linerate.version_in(logs))
    record["line_rate"]["above_line_rate"] = flags
    for f in flags:
        if say:
            say(f"# warning: {f['message']}")


def line_rate_metrics(rows: list[Row], op_names, per_comm: float | None) -> dict:
    """busbw figures as % of one communicator's line rate (multi-node runs with a known rate)."""
    from workloads.fabric.linerate import pct

    if per_comm is None:
        return {}
    total = summarize(rows)
    out = {"line_rate(GB/s)": per_comm, "avg_busbw(%line)": pct(total["avg_busbw"], per_comm),
           "peak_busbw(%line)": pct(total["peak_busbw"], per_comm)}
    for name in op_names:
        out[f"{name}/avg_busbw(%line)"] = pct(summarize([r for r in rows if r.op == name])["avg_busbw"], per_comm)
    return out


def p2p_metrics(p2p: list, tests) -> dict:
    """Headline figures of the osu-style tests: the lowest latency and the peak bandwidths."""
    out = {}
    if "latency" in tests:
        out["p2p_min_latency(us)"] = min(r.value for r in p2p if r.test == "latency")
    for test in ("bw", "bibw"):
        if test in tests:
            out[f"p2p_peak_{test}(MB/s)"] = max(r.value for r in p2p if r.test == test)
    return out


def _judge(s: Settings, rows: list[Row], record: dict) -> None:
    """A run is ok only when every element was right and every op met min_busbw."""
    m = record["metrics"]
    slow = below_min_busbw(rows, s.sweep.ops, s.checks.min_busbw)
    if rows and m["wrong_elements"]:
        record["status"] = "failed"
        record["error"] = f"{m['wrong_elements']} wrong elements in {m['rows_with_wrong']} measurements"
    elif slow:
        record["status"] = "failed"
        record["error"] = ("avg bus bandwidth below 0.9 x collectives.min_busbw="
                           f"{s.checks.min_busbw:g} GB/s (the NCCL_TESTS_MIN_BW rule, per op as each footer "
                           "says) for " + ", ".join(f"{op} ({bw:g} GB/s)" for op, bw in slow))
    else:
        record["status"] = "ok"


class CollectivesFailed(Fault):
    """Measured, recorded, and wrong (bad elements or below min_busbw): exit 1. Every rank raises
    it with the same message (the rows are combined over ranks), so rank 0 alone says it."""

    agreed = True


def metrics(rows: list[Row], op_names) -> dict:
    """The record's headline numbers; keys carry units.

    `<op>/avg_busbw(GB/s)` is that op's nccl-tests "Avg bus bandwidth" (the mean busbw of
    every reported cell of the op, count-0 rows at 0): the figure to compare per op.
    `avg_busbw(GB/s)` applies the same rule to every reported cell of every op that ran.
    With one op it is exactly that op's footer; with several it blends ops whose busbw
    means different traffic (all_reduce's 2(n-1)/n ring vs sendrecv's one link), so it is
    comparable only between runs of the same op list (the analysis identity holds the op
    list), and the table prints it as a separate, labelled footer. nccl-tests has no such
    figure: each binary runs one op.
    """
    total = summarize(rows)
    out = {
        "avg_busbw(GB/s)": total["avg_busbw"],
        "peak_busbw(GB/s)": total["peak_busbw"],
        "wrong_elements": total["wrong_elements"],
        "rows_with_wrong": total["rows_with_wrong"],
        "measurements": total["cells"],
    }
    for name in op_names:
        mine = summarize([r for r in rows if r.op == name])
        out[f"{name}/avg_busbw(GB/s)"] = mine["avg_busbw"]
    return out


def below_min_busbw(rows: list[Row], op_names, min_busbw: float | None) -> list[tuple[str, float]]:
    """(op, its average) for every op whose footer says FAILED under NCCL_TESTS_MIN_BW's rule.
    Per op, as nccl-tests applies it per binary: a blend of ops would let a fast all_reduce
    hide a slow alltoall (or a slow sendrecv fail a healthy all_reduce)."""
    out = []
    for name in op_names:
        mine = [r for r in rows if r.op == name]
        avg = summarize(mine)["avg_busbw"]
        if mine and min_bw_verdict(avg, min_busbw) == "FAILED":
            out.append((name, avg))
    return out
