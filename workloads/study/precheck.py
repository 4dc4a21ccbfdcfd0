"""What a study's plan checks before any allocation is spent: every arm x workload config composed
and checked as its run would check it, the arms' tuning knobs named (fairness), and how long the
study will take (a suggested `sbatch --time`), from earlier runs or a one-block pilot.
docs/studies.md ("Before the allocation") says what each line means.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import replace

from workloads import CONF_DIR
from workloads.core.errors import UsageError
from workloads.study.spec import Arm, StudySpec, Workload

# What the fabric is on a given cluster (which devices, which interfaces, which GID): site
# settings, expected to differ between an IB and a RoCE arm. Every other variable is a tuning
# knob, and an arm that differs in one is that fabric *at those settings* (the fairness line).
PLACEMENT = frozenset({
    "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE",
    "NCCL_NET", "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE",
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_P2P_LEVEL", "NCCL_NVLS_ENABLE",
})
# Slurm's --time rounds to minutes; the margin covers a run slower than the median and the
# study's own start (compose, plan, verdicts and report at the end).
TIME_MARGIN = 1.25
TIME_SLACK_S = 600
TIME_STEP_S = 900


def job_points(workload: Workload, arm: Arm) -> tuple[str, ...]:
    """Compose the job's config (a bad override is one message before anything runs);
    an inference sweep writes one record per load point, named as its records name it."""
    from workloads.core.config import compose

    if not workload.kind.served:
        overrides = [*workload.argv, *arm.overrides, f"fabric={arm.fabric}"]
        cfg = compose(CONF_DIR, overrides)
        # the workload's own checks (a batch that does not divide, ...) for the world it will
        # run at, so a bad cell is one line now, not a failure in every cell later; inside a
        # Slurm allocation the world is the allocation's, known only to the step
        if arm.emulated:
            from workloads.fabric.emuplan import spec_from_overrides

            spec_from_overrides(CONF_DIR, overrides)
        elif not os.environ.get("SLURM_JOB_ID"):
            from workloads.core.config import validate_job

            validate_job(cfg, int(cfg.launcher.nproc_per_node))
        return ("",)
    from workloads.inference.run import arrivals

    cfg = compose(CONF_DIR, [*workload.argv, *arm.overrides, f"fabric={arm.fabric}"])
    return tuple(a.label() for a in arrivals(cfg.load))


def arm_profiles(spec: StudySpec) -> tuple[dict[str, object], list[str]]:
    """Each arm's fabric profile as its cells compose it (the first workload's config: a
    workload's overrides rarely touch fabric.env, and every cell is composed by check_cells), and
    one line per cell whose config cannot run: a bad override, a fabric variable no library reads
    (`fabric.env.NCCL_SOCKT_IFNAME`), a workload's own check."""
    from omegaconf import OmegaConf

    from workloads import session
    from workloads.core.config import compose, validate_job
    from workloads.core.rundir import register_resolvers
    from workloads.fabric.profile import FabricProfile

    register_resolvers()
    profiles: dict[str, object] = {}
    problems: dict[tuple[str, str], list[str]] = {}  # (arm, message) -> workloads it holds for
    for arm in [a for a in spec.arms if not a.control]:  # the A/A control composes as its baseline does
        for w in spec.workloads:
            try:
                cfg = compose(CONF_DIR, [*w.argv, *arm.overrides, f"fabric={arm.fabric}"])
                profile = FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))
                with session.planning():  # this host's GPU and devices: host_lines, or each run's own start
                    if arm.emulated or w.kind.served:
                        job_points(w, arm)  # as the real start checks them
                    else:  # the workload's own checks at the world its runs will have
                        validate_job(cfg, spec.world or int(cfg.launcher.nproc_per_node))
            except UsageError as e:
                problems.setdefault((arm.label, str(e).splitlines()[0]), []).append(w.name)
                continue
            profiles.setdefault(arm.label, profile)
    lines = [f"arm {arm} x {', '.join(ws) if len(ws) < len(spec.workloads) else 'every workload'}: {msg}"
             for (arm, msg), ws in problems.items()]
    return profiles, lines


def host_lines(spec: StudySpec, profiles: dict[str, object]) -> tuple[list[str], list[str]]:
    """(notes, problems) of the preflight each cell's run makes (workloads/fabric/preflight.py),
    made here when this host is one the arms run on: it has RDMA devices, or sysfs is a given tree
    (FABRICBENCH_SYSFS_ROOT), or no arm needs RDMA. A login node without RDMA devices is not one of
    the study's nodes: its check would fail every IB arm for the wrong reason, so it is said, not made."""
    from workloads.fabric import preflight

    arms = {a.label: a for a in spec.arms}
    real = {label: p for label, p in profiles.items() if not arms[label].emulated}
    if not real:
        return [], []
    ib = [label for label, p in real.items() if preflight.uses_ib(p, preflight.effective_env(p.env))]
    root = preflight.sysfs_root()
    if ib and not os.environ.get(preflight.SYSFS_ENV) and not _rdma_here():
        return [f"  host checks: not made on {socket.gethostname()} (no RDMA devices here: a login node?); each run "
                f"makes them on its nodes; to make them now, run this plan on a compute node (srun -N1 "
                f"fabricbench study {spec.source} --plan) or `fabricbench doctor fabric=...` there"], []
    problems = [f"arm {label} (fabric={p.name}): {msg}" for label, p in real.items() for msg in preflight.check(p)]
    notes = [] if problems else [f"  host checks: every arm's devices and interfaces are present and up "
                                 f"({socket.gethostname()}, sysfs {root})"]
    return notes, problems


def _rdma_here() -> list:
    from workloads.fabric import preflight

    return preflight.rdma_ports()


def fairness_lines(spec: StudySpec, profiles: dict[str, object]) -> list[str]:
    """Every tuning knob (a fabric variable that is not placement, PLACEMENT) whose value differs
    between the real arms: each arm is its fabric at those settings, and the verdict says so."""
    arms = [a for a in spec.arms if not a.control and a.label in profiles]
    if len(arms) < 2:
        return []
    envs = {a.label: {k: v for k, v in profiles[a.label].env.items() if k not in PLACEMENT} for a in arms}
    knobs = sorted({k for env in envs.values() for k in env})
    differ = [k for k in knobs if len({envs[a.label].get(k) for a in arms}) > 1]
    if not differ:
        return ["  fairness: the arms differ in no tuning knob (only in which devices and interfaces they use)"]
    out = [f"  fairness: the arms differ in {len(differ)} tuning knob(s); each verdict compares a fabric at these "
           "settings (tune each to its best first: docs/tune.md):"]
    for k in differ:
        out.append(f"    {k}: " + ", ".join(f"{a.label} {envs[a.label].get(k) or 'unset'}" for a in arms))
    if any(envs[a.label].get("NCCL_IB_TC") for a in arms):
        out.append("    NCCL_IB_TC is not checked against the switches: it must be the lossless (PFC/ECN) "
                   "priority's traffic class there (ask the network team; `fabricbench doctor` shows the pause and "
                   "CNP counters that move when it is)")
    return out


def check(spec: StudySpec) -> list[str]:
    """The lines the plan adds, after checking every cell: raises UsageError naming every problem."""
    profiles, problems = arm_profiles(spec)
    notes, host = host_lines(spec, profiles)
    problems += host
    if len(problems) == 1:
        raise UsageError(f"study {spec.id}, before any run: {problems[0]}")
    if problems:
        raise UsageError("\n".join([f"study {spec.id}: {len(problems)} problem(s) before any run (fix them, then "
                                    "rerun --plan):", *(f"  - {p}" for p in problems)]))
    n = sum(not a.control for a in spec.arms) * len(spec.workloads)
    control = " (the A/A control's are its baseline's)" if any(a.control for a in spec.arms) else ""
    return [f"  configs: all {n} arm x workload configs compose and pass their checks{control}", *notes,
            *fairness_lines(spec, profiles)]


def slurm_time(seconds: float) -> str:
    """A `--time` for `seconds` of study: x1.25 plus 10 minutes, up to the next quarter hour, as
    Slurm writes it (H:MM:SS, D-HH:MM:SS from a day)."""
    s = int(math.ceil((seconds * TIME_MARGIN + TIME_SLACK_S) / TIME_STEP_S) * TIME_STEP_S)
    d, h, m = s // 86400, s % 86400 // 3600, s % 3600 // 60
    return f"{d}-{h:02d}:{m:02d}:00" if d else f"{h}:{m:02d}:00"


def time_lines(plan, pilot: bool = False) -> list[str]:
    """The suggested --time from the plan's wall time, and the resume rule."""
    spec = plan.spec
    wall = plan.wall_seconds()
    resume = ("  resume: resubmitting the same command resumes (finished runs are kept; an allocation that expires "
              "loses only the run in flight): give --time the estimate, or less and resubmit")
    if wall is None:
        missing = [w.name for w in spec.workloads if w.name not in plan.seconds]
        return [f"  sbatch --time: no estimate ({', '.join(missing)} never ran under {spec.output_root}); "
                f"`fabricbench study {spec.source} --plan --pilot` runs one block and estimates from it", resume]
    where = "the pilot block and earlier runs" if pilot else "earlier runs of the same workloads"
    return [f"  sbatch --time={slurm_time(wall)} (the wall time {wall / 3600:.2f} h from {where}, x{TIME_MARGIN:g} "
            f"+ {TIME_SLACK_S // 60} min)", resume]


def pilot_spec(spec: StudySpec) -> StudySpec:
    """One block of every arm x workload, as a study of its own (`<id>-pilot` beside the study):
    its timings and records are earlier runs of the same workloads to the study's plan, and never
    the study's own blocks."""
    return replace(spec, id=f"{spec.id}-pilot", name=f"{spec.name}-pilot", blocks=1, blocks_given=True,
                   arms=tuple(a for a in spec.arms if not a.control))
