"""The replay workload: a captured run's collectives, alone, on this fabric.

    python launch/replay.py replay.trace=results/<run>/records/pretrain-....json
    sudo python launch/emulate.py launch/replay.py fabric=emu-100m replay.trace=<record or FR dump>

The trace (workloads/replay/trace.py) is a training record's per-step collectives or a Flight
Recorder dump. Each replayed step launches the step's collectives in their captured order with
buffers of their captured sizes and dtypes, every one on the whole world (a DDP gradient bucket
is the same size on 2 ranks or 512), and times it as the training run's CommTimer does: the
wall time with at least one collective in flight. `replay.pace`:
  - `gaps` (default): each call starts at its captured offset from the step's start, so the gaps
    the job's compute left between launches stay; the in-flight time is then comparable with the
    training run's own comm time (the record's `samples.comm_time_s`);
  - `none`: every call is launched at once, back to back: the fabric's time for the pattern alone.
Metrics (docs/metrics.md): `comm_time_per_step(s)`, the mean over replayed steps; beside it the
captured run's `original_comm_time_per_step(s)` over the same steps and their ratio.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from workloads import session
from workloads.core import dist as fdist
from workloads.core.errors import Fault, UsageError
from workloads.core.fingerprint import fingerprint
from workloads.fabric.profile import FabricProfile
from workloads.replay.trace import Call, Trace, load
from workloads.training.commtimer import union_length

PACES = ("gaps", "none")


@dataclass(frozen=True)
class ReplayPlan:
    trace: Trace
    steps: int               # replayed steps timed (cycling through the trace's steps)
    warmup_steps: int        # replayed first, not timed
    pace: str
    fabric: FabricProfile
    run: session.RunContext


def validate(cfg: DictConfig, world: int) -> ReplayPlan:
    """Everything checkable before a process group exists. Raises UsageError."""
    fabric = session.prepare(cfg)
    r = session.section(cfg, "replay")
    if not r.get("trace"):
        raise UsageError("replay.trace is not set; give a training record (results/<run>/records/pretrain-*.json) or "
                         "a Flight Recorder JSON dump: replay.trace=PATH")
    trace = load(r["trace"])
    sub = sorted({c.group_size for s in trace.steps for c in s if c.group_size and c.group_size != trace.world})
    if sub:
        raise UsageError(f"replay.trace={r['trace']}: it has collectives on groups of {sub} ranks, not the whole "
                         f"world of {trace.world}; replay runs every collective on the whole world (DP traces)")
    steps, warm = int(r.get("steps", 20)), int(r.get("warmup_steps", 2))
    if steps < 1 or warm < 0:
        raise UsageError(f"replay.steps={steps}, replay.warmup_steps={warm}: use steps >= 1 and warmup_steps >= 0")
    pace = str(r.get("pace", "gaps"))
    if pace not in PACES:
        raise UsageError(f"replay.pace={pace!r}; use one of {', '.join(PACES)}")
    if pace == "gaps" and any(c.start_s is None for s in trace.steps for c in s):
        raise UsageError(f"replay.trace={r['trace']}: some calls carry no launch time; use replay.pace=none")
    return ReplayPlan(trace, steps, warm, pace, fabric, session.context(cfg))


class ReplayFailed(Fault):
    """The replayed collectives failed: recorded, exit 1; agreed over the group, so rank 0 alone says it."""

    agreed = True


def run_replay(cfg: DictConfig, overrides: list[str] | None = None) -> Path | None:
    _, world, _, _ = fdist.launch_env()
    plan = validate(cfg, world)
    info, run_dir, applied_env = session.start(plan.run, plan.fabric)
    t = plan.trace
    record = session.base_record(
        "replay", plan.run, plan.fabric, applied_env, run_dir.name, overrides,
        world={"world_size": info.world_size, "nodes": info.nodes, "local_world_size": info.local_world_size},
        replay={"source": t.source, "trace": t.path, "captured_world": t.world, "trace_steps": len(t.steps),
                "calls_per_step": sum(len(s) for s in t.steps) / len(t.steps), "pace": plan.pace,
                "steps": plan.steps, "warmup_steps": plan.warmup_steps},
        fingerprint=fingerprint(),
        metrics={},
        samples={},
    )
    path = session.run_point(session.Point(record, run_dir / "records", f"replay-{plan.fabric.name}-n{info.world_size}", info),
                             lambda: _measure(plan, info, record), plan.run.tracking)
    if record["status"] != "ok":
        fdist.wait_for_writer(info)
        raise ReplayFailed(record["error"])
    return path


def _buffers(call: Call, world: int, device) -> tuple:
    """(launch, elements actually sent): the call's tensors, made once, and its async launcher."""
    dtype = getattr(torch, call.dtype)
    n = call.numel
    if call.op in ("reduce_scatter", "alltoall"):
        n = -(-n // world) * world  # whole chunks per rank
    x = torch.ones(n, dtype=dtype, device=device)
    if call.op == "all_reduce":
        return (lambda: dist.all_reduce(x, async_op=True)), n
    if call.op == "broadcast":
        return (lambda: dist.broadcast(x, src=0, async_op=True)), n
    if call.op == "reduce":
        return (lambda: dist.reduce(x, dst=0, async_op=True)), n
    if call.op == "all_gather":
        out = torch.empty(n * world, dtype=dtype, device=device)
        return (lambda: dist.all_gather_into_tensor(out, x, async_op=True)), n
    if call.op == "reduce_scatter":
        out = torch.empty(n // world, dtype=dtype, device=device)
        return (lambda: dist.reduce_scatter_tensor(out, x, async_op=True)), n
    out = torch.empty_like(x)
    return (lambda: dist.all_to_all_single(out, x, async_op=True)), n


def replay_step(launchers: list, starts: list[float | None], device) -> float:
    """Seconds with at least one of the step's collectives in flight, launched at `starts`
    (offsets from now; None: at once)."""
    fdist.synchronize(device)
    intervals: list[list[float]] = []
    works = []
    t0 = time.perf_counter()
    for launch, start in zip(launchers, starts):
        if start is not None:
            wait = t0 + start - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        slot = [time.perf_counter() - t0, None]
        intervals.append(slot)
        work = launch()
        work.get_future().then(lambda _f, slot=slot: slot.__setitem__(1, time.perf_counter() - t0))
        works.append(work)
    for w in works:
        w.wait()
    fdist.synchronize(device)
    end = time.perf_counter() - t0
    return union_length([(a, b if b is not None else end) for a, b in intervals])


def _measure(plan: ReplayPlan, info: fdist.DistInfo, record: dict) -> None:
    t, world = plan.trace, info.world_size
    steps = [[_buffers(c, world, info.device) for c in s] for s in t.steps]
    # the step's compute before its first collective is not replayed: offsets from the first launch
    starts = [[c.start_s - min(x.start_s for x in s) if plan.pace == "gaps" else None for c in s] for s in t.steps]
    times = []
    for i in range(plan.warmup_steps + plan.steps):
        k = i % len(steps)
        dist.barrier()
        took = replay_step([b[0] for b in steps[k]], starts[k], info.device)
        if i >= plan.warmup_steps:
            times.append(took)
    n = len(times)
    replayed = [i % len(steps) for i in range(plan.warmup_steps, plan.warmup_steps + n)]
    mean = sum(times) / n
    m = {"comm_time_per_step(s)": mean, "calls_per_step": sum(len(steps[k]) for k in replayed) / n,
         "bytes_per_step(B)": sum(b[1] * getattr(torch, c.dtype).itemsize for k in replayed
                                  for b, c in zip(steps[k], t.steps[k])) / n}
    if t.comm_time_s:
        orig = sum(t.comm_time_s[k] for k in replayed) / n
        m["original_comm_time_per_step(s)"] = orig
        m["replay_vs_original"] = mean / orig if orig else None
    record["metrics"] = m
    record["samples"] = {"comm_time_s": times, "trace_step": replayed}
    if info.is_main:
        line = f"replay of {t.source} {Path(t.path).name}: {mean * 1e3:.2f} ms of communication per step ({plan.pace})"
        if "original_comm_time_per_step(s)" in m:
            line += (f"; the captured run: {m['original_comm_time_per_step(s)'] * 1e3:.2f} ms "
                     f"(replay/original {m['replay_vs_original']:.3f})")
        print(line, flush=True)
