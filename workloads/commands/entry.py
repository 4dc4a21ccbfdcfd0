"""What every launch/*.py entry point shares: the Hydra main, self-launch, and how a run ends.
(Composing and checking a config, which the study and the emulator need too, is
workloads/core/config.py.)

`hydra_entry` turns a workload function into a Hydra main that prints a UsageError as
one `error:` line (exit 2, or the error's own code) and Ctrl-C as one line (exit 130).

For distributed entry points started with plain `python` (no torchrun, no Slurm task),
`self_launch` validates every sweep point's config in this process (a bad value is one
message, before any rank starts), then starts `launcher.nproc_per_node` local ranks with
torchrun's own machinery and reports a failed rank in one line instead of torchrun's
traceback. A sweep sent to Slurm by `hydra/launcher=slurm` is not self-launched:
this process only submits, and each job's Slurm tasks are the ranks.

Signals (workloads/core/signals.py): SIGTERM is handled as Ctrl-C is (the interrupted point's
record is written as failed), with exit 143 instead of 130. Self-launched ranks die with the launcher, even a
SIGKILLed one (PR_SET_PDEATHSIG), and a point whose writing rank died without writing its
record (rank 0 SIGKILLed, OOM-killed) still gets a failed record: the writer leaves an
in-flight copy that the launcher turns into one, naming how the rank died
(workloads/core/inflight.py; under a raw torchrun a surviving rank does it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NoReturn

from workloads import CONF_DIR, catalog
from workloads.core import celllock, errors, forkrank, signals, timeline
from workloads.core.config import add_override, compose, config_errors, expand_sweep, validate_job
from workloads.core.errors import AlreadyRecorded, UsageError, say
from workloads.core.hostmem import oom_killed_since, oom_kills
from workloads.core.inflight import INFLIGHT_ENV, recover
from workloads.core.inflight import SUFFIX as INFLIGHT_SUFFIX

LAUNCHER_ENV = "FABRICBENCH_LAUNCHER_PID"   # set for ranks that self_launch started
QUIET_WAIT_S = 10.0  # how long a rank that does not speak for its node waits for the one that does
_PR_SET_PDEATHSIG = 1


def die_with_launcher() -> None:
    """In a rank that self_launch started: SIGTERM when the launcher dies, SIGKILL included.
    PR_SET_PDEATHSIG fires when the thread that forked us ends; torch's agent forks ranks from
    the launcher's main thread, whose end is the process's end, so this is the process's death."""
    parent = os.environ.get(LAUNCHER_ENV)
    if not parent or not launched():
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != int(parent):  # it died before the prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


# How Gloo and the c10d store say that the other end of a connection is gone.
_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def _peer_lost(e: BaseException) -> str | None:
    """Which of Gloo's words for a vanished peer this exception carries (a peer rank exited, by
    SIGKILL or after its own one-line error, while this rank was in a collective); None for any
    other exception. Its traceback would bury the failing rank's line, which the launcher (or
    torchrun) points to."""
    text = str(e)
    if isinstance(e, RuntimeError) and any(s in text for s in _PEER_LOST):
        return next(s for s in _PEER_LOST if s in text)
    return None


def _report_job_error(overrides: list[str]) -> None:
    """Hydra's own "Error executing job" line and traceback, through the one redaction
    (workloads/core/records.py): Hydra would print the overrides as given, secrets and all."""
    import traceback

    from workloads.core.redact import redact, redact_text

    print(f"Error executing job with overrides: {redact(list(overrides))}", file=sys.stderr)
    print(redact_text(traceback.format_exc()), file=sys.stderr, end="", flush=True)


def _should_say(e: UsageError) -> bool:
    """Before the process group exists every rank of a node checks the same config, so
    local rank 0 speaks for its node (a node-specific error, a missing HCA, still shows);
    after init an error may be one rank's own, so every rank says it, unless the error says it
    is `agreed` (every rank holds it from one collective): then rank 0 alone."""
    pg = sys.modules.get("torch.distributed")
    started = pg is not None and pg.is_available() and pg.is_initialized()
    if started and getattr(e, "agreed", False):  # the same error on every rank, agreed over the group: once
        return os.environ.get("RANK", "0") == "0"
    return started or os.environ.get("LOCAL_RANK", "0") == "0"


def _say(e: UsageError) -> None:
    """Print the error if this rank speaks for its node; else give the rank that does time to.

    The first rank to fail is the one torchrun's agent reports, and it SIGTERMs the others at
    once: a quiet rank that exits first can silence its node's speaker before it has printed
    (seen on a slow machine: "interrupted" in place of the one error line). So a quiet rank
    waits; the speaker's exit ends the wait (the agent's SIGTERM), and QUIET_WAIT_S bounds it
    where nothing sends one (srun without --kill-on-bad-exit)."""
    if _should_say(e):
        say(e)
    elif launched():
        errors.for_the_agent(e.line())  # whichever rank torchrun names as the root cause shows the line
        time.sleep(QUIET_WAIT_S)


def launched() -> bool:
    """True inside a rank that torchrun or Slurm started."""
    return "LOCAL_RANK" in os.environ or "SLURM_PROCID" in os.environ


def self_launch(script: str, argv: list[str], conf_dir: str = CONF_DIR, config_name: str = "config") -> int | None:
    """Validate, then run `script` as local ranks. None: run it in this process instead
    (a launcher plugin such as submitit places the ranks)."""
    from workloads.core import rundir

    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if not a.startswith("-")]
    run_dirs = set()
    try:
        forkrank.mode()  # FB_RANK_START checked before anything starts
        jobs = expand_sweep(overrides) if multirun else [overrides]
        if multirun:
            target = str(compose(conf_dir, jobs[0], config_name, hydra_config=True).hydra.launcher.get("_target_", ""))
            if "submitit" in target.lower():
                return None
        nproc, what = None, ""
        for job in jobs:
            cfg = compose(conf_dir, job, config_name)
            nproc = int(cfg.launcher.nproc_per_node)
            if nproc <= 0:
                raise UsageError(f"launcher.nproc_per_node must be positive, got {nproc}")
            validate_job(cfg, nproc)
            run_dirs.add(rundir.run_dir(str(cfg.output_root), cfg.get("run_id")))
            if len(jobs) == 1 and "train" in cfg and "model" in cfg:  # what an out-of-memory rank needed memory for
                what = f"model={cfg.model.name} at train.micro_batch_size={cfg.train.micro_batch_size}"
    except UsageError as e:
        return say(e)

    # The ranks' run folder is named as a plain `python` run's (<time>-p<this pid>), as run_dirs
    # are, not after the random rendezvous id of _run_ranks' --standalone agent (rdzv-<uuid>),
    # which tells a user nothing. Set here only: a submitit sweep's jobs (returned above) keep theirs.
    os.environ.setdefault(rundir.RUN_ID_ENV, rundir.resolve_run_id())
    code = _run_ranks(script, argv, nproc, what)
    if code:
        for d in run_dirs:
            drop_if_nothing_in(d)
    return code


def drop_if_nothing_in(run_dir: str) -> None:
    """A run that ended before writing any file leaves no run folder (Hydra made it, and maybe
    its empty records/ or nccl/, in each rank before the ranks refused or failed): empty
    folders piled up in output_root, one a refusal. Any file in it (a record, a log, another
    run's records under the same run_id) keeps all of it."""
    root = Path(run_dir)
    if not root.is_dir() or any(p.is_file() or p.is_symlink() for p in root.rglob("*")):
        return
    for d in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True) + [root]:
        try:
            d.rmdir()
        except OSError:  # something appeared meanwhile: it stays
            return


def _check_path_overrides(argv: list[str]) -> None:
    """Hydra resolves the run folder before any workload code runs, and would wrap this
    error in its own traceback: check run_id= here (each value of a sweep). And the bare
    Slurm launcher, which composes but whose jobs could never start a process group."""
    from workloads.core.rundir import check_run_id

    for a in argv:
        key, _, value = a.lstrip("+~").partition("=")
        if key == "run_id" and value:
            for v in value.split(","):
                check_run_id(v.strip())
        if key == "hydra/launcher" and value == "slurm":
            _slurm_answers()
        if key == "hydra/launcher" and value == "submitit_slurm":
            raise UsageError("hydra/launcher=submitit_slurm is the plugin's bare launcher: its jobs lack the setup lines "
                             "that give each rank MASTER_ADDR and one run folder; write hydra/launcher=slurm, fabricbench's "
                             "launcher on top of it (conf/hydra/launcher/slurm.yaml)")


def _slurm_answers() -> None:
    """hydra/launcher=slurm submits each job with sbatch: without a Slurm controller that answers,
    submitit printed sbatch's error and its own 45-line traceback."""
    import subprocess

    if shutil.which("sbatch") is None:
        raise UsageError("hydra/launcher=slurm submits each job with sbatch, which is not on this host's PATH; run from "
                         "a Slurm login node, or drop hydra/launcher=slurm to run here")
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
        ok, said = r.returncode == 0, (r.stderr or r.stdout).strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, said = False, [str(e)]
    if not ok:
        raise UsageError("hydra/launcher=slurm: no Slurm controller answers from this host (scontrol ping: "
                         f"{said[-1] if said else 'no answer'}); run from a Slurm login node, or drop "
                         "hydra/launcher=slurm to run here")


def _compose_each_job(argv: list[str], config_name: str) -> None:
    """Hydra's own errors (an unparsable override, an unknown group option) are several lines
    and a hint about HYDRA_FULL_ERROR: compose first, and let ours be the one line."""
    overrides = [a for a in argv if not a.startswith("-")]
    multirun = any(a in ("-m", "--multirun") for a in argv)
    for job in expand_sweep(overrides) if multirun else [overrides]:
        compose(CONF_DIR, job, config_name)


def _quiet_torchelastic() -> None:
    import logging

    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed.elastic") or name.startswith("torch.distributed.run"):
            logging.getLogger(name).setLevel(logging.CRITICAL)  # the launcher names the failed rank itself


# Whether this process ran torchrun's agent in-process (a self-launch, an emulated node's agent).
# Its rendezvous store keeps C++ threads, and interpreter teardown while they live ended the
# launcher with SIGABRT after it had said "interrupted ... measured points are kept" ("terminate
# called without an active exception", 1 run in 14 of the Ctrl-C test under load): such a process
# ends as a rank does, without teardown (_end).
_AGENT_RAN = False


def _warm(script: str) -> tuple[str, ...]:
    """What every rank imports on its way to its first step (forkrank.warm)."""
    return forkrank.RANK_IMPORTS


def _run_ranks(script: str, argv: list[str], nproc: int, job: str = "") -> int:
    global _AGENT_RAN
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    _AGENT_RAN = True
    _quiet_torchelastic()
    inflight = tempfile.mkdtemp(prefix="fabricbench-inflight-")
    os.environ[LAUNCHER_ENV], os.environ[INFLIGHT_ENV] = str(os.getpid()), inflight
    args = get_args_parser().parse_args(["--standalone", f"--nproc_per_node={nproc}", script, *argv])
    code, why = 0, "the run ended without writing this record"
    ooms = oom_kills()
    try:
        with forkrank.forking(_warm(script)):
            run(args)
    except ChildFailedError as e:
        what, code = _rank_failure(e, oom_killed_since(ooms), job)
        why = f"{what} during this point"
    except (SignalException, KeyboardInterrupt) as e:
        sig = getattr(e, "sigval", signal.SIGINT)
        why = f"interrupted ({signal.Signals(sig).name})"
        print(f"interrupted ({signal.Signals(sig).name}): measured points are kept", file=sys.stderr)
        code = 128 + int(sig)
    finally:
        for path in recover(inflight, why):
            print(f"the interrupted point's record (failed): {path}", file=sys.stderr)
        if not any(Path(inflight).glob(f"*{INFLIGHT_SUFFIX}")):  # a copy no one could write stays, as its warning says
            shutil.rmtree(inflight, ignore_errors=True)
    return code


def torchrun(args: list[str]) -> int:
    """torchrun in this process (emulate's per-namespace agents); a failed rank becomes one
    line and its exit code instead of torch's ChildFailedError traceback, and a stop signal
    (Ctrl-C reaches every agent; the emulator then SIGTERMs them) its exit code alone: the
    emulator says once that the run was interrupted, and the ranks keep what they measured."""
    global _AGENT_RAN
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    _AGENT_RAN = True
    parsed = get_args_parser().parse_args(args)
    try:
        with forkrank.forking(_warm(parsed.training_script)):
            run(parsed)
    except ChildFailedError as e:
        return _rank_failure(e)[1]
    except (SignalException, KeyboardInterrupt) as e:
        return 128 + int(getattr(e, "sigval", signal.SIGINT))
    return 0


def _rank_failure(e, oom: bool = False, job: str = "") -> tuple[str, int]:
    """The first failed rank (failures are keyed by global rank), said in one line; and the
    exit code to pass on (128 + signal for a killed rank, as a shell reports it). `oom`: the
    kernel's OOM killer ended a process meanwhile (hostmem.oom_killed_since), so a rank's SIGKILL
    was it, said with `job` (the model and micro-batch that needed the memory)."""
    rank, first = min(e.failures.items(), key=lambda kv: kv[1].timestamp)
    what = f"rank {rank} {_exit_words(first.exitcode)}"
    if oom and first.exitcode == -signal.SIGKILL:
        what = (f"rank {rank} was killed by the kernel's out-of-memory killer (SIGKILL, exit code -9): out of memory"
                + (f" with {job}" if job else "") + "; use a smaller micro-batch or model, or fewer ranks per node")
    # a rank killed by a signal printed nothing: there is no message above to point to
    print(f"error: {what}" + ("; its message is above" if first.exitcode > 0 else ""), file=sys.stderr)
    return what, first.exitcode if first.exitcode > 0 else 128 - first.exitcode


def _exit_words(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name} (exit code {code})"
    return f"exited with code {code}"


def refuse_other_workloads(script: str, argv: list[str]) -> None:
    """A workload= this entry point does not run (each value of a sweep) is one line naming
    the entry point that does, before anything composes or starts: launch/train.py with
    workload=inference would otherwise start ranks that fail on a training key."""
    runs = catalog.for_script(script)
    if not runs:
        return
    for a in argv:
        key, _, value = a.lstrip("+~").partition("=")
        for v in (value.split(",") if key == "workload" else ()):
            if (other := catalog.get(v.strip())) is not None and other.name not in {w.name for w in runs}:
                raise UsageError(f"{runs[0].script} runs workload={' or '.join(w.name for w in runs)}, not "
                                 f"{other.name}; run {other.script} for {other.name}")


def _precheck(config_name: str, workload: str | None, self_launching: bool, script: str = "") -> None:
    """Select the entry point's workload, then check the run id and that every job of the
    command line composes, before Hydra runs: each problem is one line (from one rank per
    node under torchrun) and exit 2, not Hydra's own multi-line message. A self-launch
    composes every job itself (self_launch), so it is not composed twice."""
    if workload and not catalog.chooses_workload(sys.argv[1:]):
        add_override(sys.argv, f"workload={workload}")
    try:
        refuse_other_workloads(script, sys.argv[1:])
        _check_path_overrides(sys.argv[1:])
        if not self_launching:
            _compose_each_job(sys.argv[1:], config_name)
    except UsageError as e:
        _say(e)  # under torchrun: one rank per node, not every rank
        sys.exit(e.exit_code)


def _multirun_first(argv: list[str]) -> None:
    """`launch/train.py a=1 -m b=1,2`: Hydra takes its flags before the overrides, and printed
    its usage (from every rank) for a `-m` after one. The sweep is meant: `-m` is moved first,
    in place, so that ranks started from this argv get it there too."""
    flags = [a for a in argv[1:] if a in ("-m", "--multirun")]
    if flags and argv[1] not in ("-m", "--multirun"):
        argv[1:] = [flags[0], *(a for a in argv[1:] if a not in ("-m", "--multirun"))]


def _end(code: int | str | None) -> None:
    """A process that made a process group, or ran torchrun's agent, ends without interpreter
    teardown (dist.exit_process); any other returns, to end as usual."""
    if _AGENT_RAN:
        from workloads.core.dist import exit_process

        exit_process(code)
    if "workloads.core.dist" in sys.modules:  # no torch import for a job that never needed one
        from workloads.core.dist import exit_process, made_group

        if made_group():
            exit_process(code)


def end(code: int | str | None) -> NoReturn:
    """sys.exit(code) for a command's `__main__`, through _end (emulate's agents)."""
    _end(code)
    sys.exit(code)


def root_groups(config_name: str, workload: str | None = None) -> set[str]:
    """The config groups a user may choose for an entry point: those the root `config_name`
    composes (its defaults list) and those its `workload` brings in (inference: server, load),
    named as a user passes them (`workload`, which also holds workload/init). An entry point
    that runs one `workload` offers neither the workload group nor the groups that measure
    nothing there (the catalog's not_applicable: parallel for served inference). conf/study/
    is not among them: it holds `fabricbench study`'s specs, which no entry point takes as
    study=<name>."""
    import yaml

    files = [f"{config_name}.yaml", *([f"workload/{workload}.yaml"] if workload else [])]
    entries = [e for f in files for e in yaml.safe_load((Path(CONF_DIR) / f).read_text()).get("defaults") or []]
    names = {key.split()[-1].lstrip("/").split("/")[0] for e in entries if isinstance(e, dict) for key in e}
    if workload:
        names -= {"workload", *catalog.field(workload, "not_applicable", ())}
    return {n for n in names if n != "hydra" and (Path(CONF_DIR) / n).is_dir()}


def only_root_groups(help_text: str, groups: set[str]) -> str:
    """Hydra's --help lists every folder of conf/ as a group, whichever root composes it (and
    conf/study/, which is no group at all): keep the lines of the groups in `groups`."""
    out, listing = [], False
    for line in help_text.splitlines(keepends=True):
        if line.startswith("== "):
            listing = line.startswith("== Configuration groups")
        elif listing and ": " in line and not line[0].isspace() and line.split(":", 1)[0].split("/")[0] not in groups:
            continue
        out.append(line)
    return "".join(out)


@contextlib.contextmanager
def _help_of_root(config_name: str, workload: str | None):
    """Around Hydra's --help: what it prints, with only the groups this entry point composes."""
    import io

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        sys.stdout.write(only_root_groups(buf.getvalue(), root_groups(config_name, workload)))
        sys.stdout.flush()


def _job(run: Callable[..., int | None], cfg) -> None:
    """One job under Hydra's main: `run(cfg, overrides)` and how it ends: a usage error's one
    line, a peer's loss, a bug's traceback (minus secrets), or the exit code it returned."""
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task)
    try:
        with config_errors():
            code = run(cfg, overrides)
    except AlreadyRecorded:  # said by rank 0; a sweep goes on to its next point, as inference sweeps do
        return
    except UsageError as e:
        _say(e)
        drop_if_nothing_in(HydraConfig.get().runtime.output_dir)
        sys.exit(e.exit_code)
    except Exception as e:
        if signals.received():  # what stopping did to this rank (a peer gone), not a bug
            raise signals.interruption() from None
        if (lost := _peer_lost(e)) is not None:  # another rank's failure reaching this one, not its own
            print(f"error: rank {os.environ.get('RANK', '0')}: a peer rank left ({lost}); the rank that failed "
                  "first says why", file=sys.stderr, flush=True)
            sys.exit(1)
        _report_job_error(overrides)  # a bug: its traceback, as Hydra would print it, minus secrets
        sys.exit(1)
    if code:
        sys.exit(code)


def _interrupted(exc: BaseException, speaks: bool) -> NoReturn:
    """A stopped run's end: one line from the process that speaks for the ranks, and the
    interruption's exit status."""
    if speaks:
        print("interrupted: measured points are kept", file=sys.stderr, flush=True)
    sys.exit(getattr(exc, "exit_code", 130))


def hydra_entry(
    script: str,
    run: Callable[..., int | None],
    *,
    config_name: str = "config",
    workload: str | None = None,
    distributed: bool = True,
) -> None:
    """The body of a launch/*.py `if __name__ == "__main__":` block.

    `run(cfg, overrides)` does the work and returns an exit code (None = 0). `workload`
    is selected unless the command line names one. `distributed` entry points
    self-launch their ranks when started with plain python."""
    import hydra
    from omegaconf import DictConfig

    from workloads.core.rundir import register_resolvers

    register_resolvers()
    if not launched():
        timeline.begin()  # this process starts the run's clock (a study's cell started it before)
    _multirun_first(sys.argv)
    _precheck(config_name, workload, self_launching=distributed and not launched(), script=script)
    if os.environ.get("RANK", "0") != "0":
        add_override(sys.argv, "hydra/hydra_logging=disabled")  # one "Launching N jobs" banner, from rank 0

    # Under self-launch the launcher speaks for the ranks when interrupted; under torchrun, rank 0.
    speaks = LAUNCHER_ENV not in os.environ and os.environ.get("RANK", "0") == "0"

    @hydra.main(config_path=CONF_DIR, config_name=config_name, version_base="1.3")
    def main(cfg: DictConfig) -> None:
        _job(run, cfg)

    signals.install()
    die_with_launcher()
    celllock.hold_shared()  # a study's cell: no rerun of the study starts a cell while this process lives
    try:
        try:
            # --help is this process's to print: self-launched, every local rank printed it
            asks_help = bool({"--help", "-h"} & set(sys.argv[1:]))
            if distributed and not launched() and not asks_help:
                code = self_launch(script, sys.argv[1:], CONF_DIR, config_name)
                if code is not None:
                    sys.exit(code)
            with _help_of_root(config_name, workload) if asks_help else contextlib.nullcontext():
                main()
        except KeyboardInterrupt as e:
            _interrupted(e, speaks)
        except Exception:
            if not signals.received():
                raise
            # the signal's exception, turned into another by the library code it interrupted
            # (signals._noted): the stop it was, not a bug
            _interrupted(signals.interruption(), speaks)
    except SystemExit as e:
        _end(e.code)
        raise
    _end(0)
