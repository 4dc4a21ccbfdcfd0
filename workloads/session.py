"""The opening and closing every distributed workload shares.

Context (`context`): what a run needs of its Hydra config besides its own plan, taken once
at the entry, so nothing below it (start, base_record, the loggers) reads a DictConfig.
Opening (`start`): export the fabric's environment, create the process group once, and
agree on one run directory across ranks. Closing (`Recorded`): whatever happens inside,
the record says so, and the writing rank puts it on disk. `run_point` is the sequence every
workload runs a point in: measure inside `Recorded`, then on rank 0 the summary and the
trackers, in that order. The inference sweep runs its points in it too, as one process
beside its server rather than a rank of a group (`group=False`).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from workloads.core import dist as fdist
from workloads.core import inflight, rundir, schema, signals, timeline
from workloads.core.errors import AlreadyRecorded, RecordNotWritten, UsageError
from workloads.core.fingerprint import cpu_affinity
from workloads.core.loggers import Loggers, Tracking, build_loggers
from workloads.core.records import check_writable, new_record, same_trial, skipped_message, write_record
from workloads.fabric import faults, kept, nccl_failover
from workloads.fabric.delaymeter import DelayMeter, check_delay_applied
from workloads.fabric.noisemeter import PointMeter
from workloads.fabric.preflight import preflight
from workloads.fabric.profile import FabricProfile


def section(cfg: DictConfig, name: str) -> dict[str, Any]:
    """The workload's own section of the config (`collectives:`, `link:`, `replay:`), resolved;
    UsageError when the config has none (another workload selected)."""
    if name not in cfg:
        raise UsageError(f"no {name}: section in the config; select it with workload={name}")
    return OmegaConf.to_container(cfg[name], resolve=True)


# False while a study's plan checks its cells (`planning`): the host it runs on is not the one
# the runs start on (a login node has no GPU and other devices); the plan makes those checks its own way.
_ON_HOST = contextvars.ContextVar("fb_on_host", default=True)


@contextlib.contextmanager
def planning():
    """prepare() without the checks of the host a run starts on (its backend's GPU, its devices)."""
    token = _ON_HOST.set(False)
    try:
        yield
    finally:
        _ON_HOST.reset(token)


def prepare(cfg: DictConfig, local: bool = True, backend: bool = True) -> FabricProfile:
    """The checks every workload makes before a process group exists: every value has its
    type, the fabric profile is valid, what it names is present on this host (`local`: this
    host carries the traffic; an external server's fabric is not ours to check), its backend
    can run in this Python (`backend`: false where another interpreter, an engine's own,
    runs it), and the output directory is writable. Raises UsageError."""
    schema.check(cfg)
    fabric = FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))
    check_delay_applied(fabric.emulate)
    local = local and _ON_HOST.get()
    if local and backend:
        fabric.check_backend_usable()
    if local:
        preflight(fabric)  # sysfs: the HCAs, GID and interfaces the profile names exist and are up
    check_writable(cfg.output_root)
    return fabric


@dataclass(frozen=True)
class RunContext:
    """A run's context beside its workload's plan: where its records go, how long the process
    group waits, the resolved config and study cell its record carries, and what its trackers
    are named from (core/loggers.Tracking)."""

    output_root: str
    run_id: str | None        # run_id= as given (None: derived, rundir.py)
    timeout_s: float | None   # dist.timeout_s; None: a root without dist: (the inference sweep has no process group)
    config: dict[str, Any]    # the resolved config, as the record's `config`
    study: dict[str, Any] | None  # the study cell (arm, block, position) when a study launched this run
    tracking: Tracking | None  # None: a root without workload: (the reference server keeps no record, no tracker)


def context(cfg: DictConfig) -> RunContext:
    """The run context, read once from the composed config (after `prepare` checked its types)."""
    config = OmegaConf.to_container(cfg, resolve=True)
    return RunContext(output_root=str(cfg.output_root), run_id=cfg.get("run_id"),
                      timeout_s=float(cfg.dist.timeout_s) if "dist" in cfg else None, config=config,
                      study=config.get("study"), tracking=Tracking.from_config(config) if "workload" in config else None)


def start(run: RunContext, fabric: FabricProfile) -> tuple[fdist.DistInfo, Path, dict[str, str]]:
    """Apply the fabric before init (NCCL reads its environment then), init once per
    process, and return (info, the run directory every rank uses, the env applied)."""
    run_dir = Path(rundir.run_dir(run.output_root, run.run_id))
    applied_env = fabric.apply(run_dir)
    info = fdist.init_once(fabric.backend, fabric.name, run.timeout_s)
    timeline.mark("group")
    if info.local_rank == 0 and (why := affinity_warning(cpu_affinity(), info.local_world_size)):
        print(f"warning: {why}", flush=True)
    agreed, disagreeing = fdist.agree(str(run_dir), info)
    if disagreeing and info.is_main:
        print(f"warning: ranks {disagreeing} derived another run directory; records go to {agreed}. "
              "Pass run_id= (or torchrun --rdzv_id) so every node agrees.", flush=True)
    return info, Path(agreed), applied_env


def affinity_warning(cpus: int | None, local_ranks: int) -> str | None:
    """Ranks (and their NCCL proxy threads, which drive the network) squeezed onto fewer CPUs
    than there are ranks measure the CPU, not the fabric: a Slurm task without
    --cpus-per-task/--exclusive gets one core on sites that bind or constrain cores."""
    if cpus is None or cpus >= local_ranks:
        return None
    return (f"this process may run on {cpus} CPU(s) (os.sched_getaffinity) but {local_ranks} ranks share "
            "this node: give the task its CPUs (sbatch --exclusive or --cpus-per-task, srun --cpu-bind=none; "
            "launch/slurm/*.sbatch do) or the figures measure CPU contention")


def base_record(workload: str, run: RunContext, fabric: FabricProfile, applied_env: dict[str, str],
                run_id: str, overrides: list[str] | None, **fields: Any) -> dict[str, Any]:
    """The fields every workload's record shares: identity, config, the fabric as applied,
    and the study cell (arm, block, position) when a study launched this run, so analysis
    can tell the design from the record alone. `run_id` is the run directory's name."""
    return new_record(
        workload,
        run_id=run_id,
        overrides=list(overrides or []),
        config=copy.deepcopy(run.config),  # the record's own: a record is filled in place, the context never
        fabric={"name": fabric.name, "backend": fabric.backend, "env": applied_env, "expect": fabric.expect,
                "verify": fabric.verify, "kept": kept.lent()},
        study=stamp_study(copy.deepcopy(run.study)),
        **fields,
    )


def stamp_study(study: dict[str, Any] | None) -> dict[str, Any] | None:
    """A study's record says when and in which process its point began (`ended` is added when
    it is written): two runs of one study that measured at the same time measured each other's
    load, and analysis and the study tell them apart by this (records.overlapped)."""
    if isinstance(study, dict):
        import os
        import socket
        import time

        study.update(started=time.time(), host=socket.gethostname(), pid=os.getpid())
    return study


def traced(exc: BaseException, tb) -> tuple[str, str]:
    """A record's error and traceback for an exception nobody foresaw: its type, its message,
    and where it came from."""
    return f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(type(exc), exc, tb))


def failure(exc: BaseException, tb) -> tuple[str, str | None]:
    """A failed point's (error, traceback or None) in a rank's record: a UsageError's message
    alone (the config's fault, which the user fixes from that line), "interrupted (Ctrl-C or
    SIGTERM)" for a stop (Recorded hands whatever followed one over as the stop), else `traced`."""
    if isinstance(exc, UsageError):
        return str(exc), None
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C or SIGTERM)", None
    return traced(exc, tb)


class Recorded:
    """`with Recorded(record, dir, stem, write=info.is_main):` runs a measurement; on the
    way out the record's status is "ok" (unless the body set its own), or "failed" with
    `describe(exc, tb)`'s error and traceback (`failure`: the traceback of anything that is
    not a UsageError), and it is written when `write` is true. The exception, if any, still
    propagates. Once this process has been asked to stop (signals.py) the point ends as that
    interruption, whatever became of the signal's exception in library code: another
    exception, or none at all. `noise`: count the emulated run's background traffic from entering to
    leaving; false where the body counts its own, narrower window.

    With `info` (the process group), entering first skips a trial that an ok record in
    `directory` already holds (AlreadyRecorded on every rank, nothing measured or written;
    the entry point goes on to the sweep's next point, so a rerun resumes): measured again,
    it would be counted as a second trial. The same
    one collective tells the other ranks where the writer will keep its in-flight copy (written
    once they all know it), so a rank on its host writes the failed record if the writer dies
    mid-point (inflight.py). Without a group there is no in-flight copy: no other rank could
    finish it, and no launcher waits to (the inference sweep checks its resume itself)."""

    def __init__(self, record: dict[str, Any], directory: Path, stem: str, write: bool,
                 info: fdist.DistInfo | None = None,
                 describe: Callable[[BaseException, Any], tuple[str, str | None]] = failure, noise: bool = True):
        self.record, self.directory, self.stem, self.write, self.info = record, directory, stem, write, info
        self.describe, self.count_noise = describe, noise
        self.path: Path | None = None
        self.inflight: Path | None = None
        self.writer: dict[str, Any] | None = None  # on the other ranks: the writer, while it measures
        self.noise: PointMeter | None = None  # an emulated run's background traffic, counted around the point
        self.delay: DelayMeter | None = None  # what an emulated delay line did around the point

    def __enter__(self) -> dict[str, Any]:
        main = self.info is None or self.info.is_main
        held = same_trial(self.directory, self.record) if self.info is not None and main else None
        copy = inflight.planned(self.directory, self.stem) \
            if self.write and held is None and self.info is not None else None
        if self.info is not None:
            mine = {"held": None if held is None else str(held), "writer": inflight.writer(copy)}
            shared, _ = fdist.agree(mine if main else None, self.info)  # rank 0 decides for all
            if shared["held"] is not None:  # every rank skips it; rank 0 says so, once
                if main:
                    print(skipped_message(Path(shared["held"]), self.record), flush=True)
                raise AlreadyRecorded(shared["held"])
            self.writer = None if self.write else shared["writer"]
        try:
            # Only now, once every rank knows where it will be: a copy written before the collective
            # that tells them would be orphaned if rank 0 died inside it (no rank could finish it).
            if copy is not None:
                try:
                    self.inflight = inflight.write(self.record, self.directory, self.stem)
                except OSError as e:  # a safety net only: the point is measured and recorded without it
                    print(f"warning: no in-flight copy of this point in {copy.parent} ({e.strerror}); should this "
                          "rank die mid-point, the point leaves no record", file=sys.stderr, flush=True)
            if self.write and self.count_noise:
                self.noise = PointMeter()
            if self.write:
                self.delay = DelayMeter()
        except BaseException as e:
            # Python calls no __exit__ for an __enter__ that raised: a Ctrl-C landing here, after
            # the copy (CI: the signal test fired as the copy appeared), left the copy to the
            # launcher, a second line. The point has begun; it ends here as any point does.
            if copy is not None and copy.exists():
                self.inflight = copy
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return self.record

    def __exit__(self, etype, exc, tb) -> bool:
        rec = self.record
        if self.noise is not None:
            self.noise.stamp(rec)
        raised = exc
        if signals.received() and not isinstance(exc, KeyboardInterrupt):
            # The stop's exception turned into another one, or swallowed: library code caught it
            # (seen in a full run: aiohttp made it a ClientPayloadError of one request, the
            # load generator counted that request failed, and the sweep finished as "partial",
            # exit 1, no line). The point ends as the interruption it is, whatever became of it.
            exc = signals.interruption()
        if exc is None:
            if rec.get("status") == "running":
                rec["status"] = "ok"
        else:
            error, trace = self.describe(exc, tb)
            rec["status"], rec["error"] = "failed", error
            if trace is not None:
                rec["traceback"] = trace
        faults.stamp(rec)  # an emulated fault schedule's events and what the job saw, with its outcome
        nccl_failover.stamp(rec, self.directory.parent)  # NCCL's own failover lines and RAS reports, if any
        if self.delay is not None:  # after the status: an ok point run at another delay fails
            self.delay.stamp(rec)
        timeline.stamp(rec)
        if self.write:
            try:
                self.path = write_record(self.directory, rec, self.stem)
            except RecordNotWritten as e:
                # The measured record is kept elsewhere (the error says where): the in-flight
                # copy, which lacks the measurement, must not become a second, failed record.
                if e.kept is not None and self.inflight is not None:
                    inflight.discard(self.inflight)
                raise
            if self.inflight is not None:
                inflight.discard(self.inflight)
        elif exc is not None and not isinstance(exc, UsageError) and self.info is not None:
            # A UsageError is the config's, seen by every rank; anything else may be the
            # writer's death reaching this rank (a peer-closed collective, torchrun's SIGTERM).
            inflight.after_writer_died(self.writer, self.info.rank, exc)
        if getattr(exc, "agreed", False) and self.info is not None:  # every rank raised it: none leaves first
            fdist.wait_for_writer(self.info)
        if exc is not raised:
            raise exc from raised
        return False


    def settle(self) -> None:
        """After a stop signal's exception left the `with`: the point is recorded, whatever the
        signal cut short. Its handler runs wherever the interpreter next looks, and that can be
        __exit__'s own first instruction, which then ends before it writes anything (seen under
        load: rank 0's collective failed as its peer stopped, and the signal landed on its way into
        __exit__; the copy was left to the launcher, a second line). The point then ends here, as
        the interruption it is; a record written but whose copy was left loses the copy."""
        if not self.write:
            return
        if self.path is None:
            self.__exit__(KeyboardInterrupt, signals.interruption(), None)
        elif self.inflight is not None:
            inflight.discard(self.inflight)


def say_record(record: dict[str, Any], path: Path) -> None:
    """The one line a point ends with when its workload prints no summary of its own."""
    print(f"record: {path}" + ("" if record["status"] == "ok" else f" (failed: {record['error']})"), flush=True)


@dataclass(frozen=True)
class Point:
    """One point to measure: its record (filled in place), the records folder and file stem it
    is written under, and `info`, this rank's DistInfo (without a process group: whatever the
    trackers are told, is_main, world_size, nodes)."""

    record: dict[str, Any]
    directory: Path
    stem: str
    info: Any


def run_point(point: Point, measure: Callable[[], None], tracking: Tracking, loggers: Loggers | None = None,
              summarize: Callable[[dict[str, Any], Path], None] = say_record, *, group: bool = True,
              label: str | None = None, describe: Callable[[BaseException, Any], tuple[str, str | None]] = failure,
              noise: bool = True) -> Path | None:
    """Measure one point and close it the same way in every workload: `measure()` runs inside
    `Recorded` (the status, the error, rank 0's write, a trial already held skipped); then, on
    rank 0 and once the record is on disk, `summarize(record, path)` and the trackers get the
    record. `loggers`: trackers the workload opened before measuring (training logs its
    steps); without them they are built here, after the write, so a slow tracker never
    delays the record. Returns the record's path on rank 0 (None elsewhere, or when an ok
    record already held this trial); the measurement's exception, if any, propagates.

    `group=False`: no process group holds this point (the inference sweep, one process beside
    its server), and Recorded neither checks for a held trial nor keeps an in-flight copy.
    `label`: the point's name in its tracker's run (one run per point); `describe`, `noise`:
    Recorded's."""
    record, info = point.record, point.info
    recorded = Recorded(record, point.directory, point.stem, write=info.is_main, info=info if group else None,
                        describe=describe, noise=noise)
    try:
        with recorded:
            measure()
    except KeyboardInterrupt:
        recorded.settle()
        raise
    finally:
        if info.is_main and recorded.path is not None:  # None: refused before measuring (a recorded trial)
            summarize(record, recorded.path)
            loggers = loggers if loggers is not None else build_loggers(tracking, info, label=label)
            loggers.log_summary(record)
        if loggers is not None:
            loggers.close()
    return recorded.path
