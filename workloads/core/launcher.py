"""What every launch/*.py entry point shares.

`hydra_entry` turns a workload function into a Hydra main that prints a UsageError as
one `error:` line (exit 2, or the error's own code) and Ctrl-C as one line (exit 130).

For distributed entry points started with plain `python` (no torchrun, no Slurm task),
`self_launch` validates every sweep point's config in this process (a bad value is one
message, before any rank starts), then starts `launcher.nproc_per_node` local ranks with
torchrun's own machinery and reports a failed rank in one line instead of torchrun's
traceback. A sweep sent to Slurm by `hydra/launcher=submitit_slurm` is not self-launched:
this process only submits, and each job's Slurm tasks are the ranks.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Callable

from workloads import CONF_DIR
from workloads.core.errors import UsageError


# workload name -> module whose validate(cfg, world) checks a config before any rank starts
VALIDATORS = {
    "pretrain": "workloads.training.run",
    "finetune": "workloads.training.run",
    "collectives": "workloads.collectives.run",
}


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Every job of a basic-sweeper multirun, as lists of plain overrides."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise UsageError(str(e).strip()) from None
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [list(job) for batch in batches for job in batch]


def compose(conf_dir: str, overrides: list[str], config_name: str = "config", hydra_config: bool = False):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            return hcompose(config_name=config_name, overrides=overrides, return_hydra_config=hydra_config)
    except (HydraException, OmegaConfBaseException) as e:
        raise UsageError(_one_line(str(e))) from None


def _one_line(message: str) -> str:
    """Hydra's multi-line composition errors as one line: the problem, and for a missing
    group option, the options there are ("Could not find 'fabric/x'" + its list)."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return "config error"
    head, rest = lines[0], lines[1:]
    if rest and rest[0].startswith("Available options"):
        options = [ln for ln in rest[1:] if not ln.startswith(("Config search path", "provider="))]
        return f"{head}; available: {', '.join(options)}"
    return head


@contextlib.contextmanager
def config_errors():
    """A config value that cannot be resolved or converted is the user's to fix: one line."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except OmegaConfBaseException as e:
        raise UsageError(f"config: {str(e).splitlines()[0]}") from None


def _should_say(e: UsageError) -> bool:
    """Before the process group exists every rank of a node checks the same config, so
    local rank 0 speaks for its node (a node-specific error, a missing HCA, still shows);
    after init an error may be one rank's own, so every rank says it."""
    pg = sys.modules.get("torch.distributed")
    started = pg is not None and pg.is_available() and pg.is_initialized()
    return started or os.environ.get("LOCAL_RANK", "0") == "0"


def launched() -> bool:
    """True inside a rank that torchrun or Slurm started."""
    return "LOCAL_RANK" in os.environ or "SLURM_PROCID" in os.environ


def self_launch(script: str, argv: list[str], conf_dir: str = CONF_DIR, config_name: str = "config") -> int | None:
    """Validate, then run `script` as local ranks. None: run it in this process instead
    (a launcher plugin such as submitit places the ranks)."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if not a.startswith("-")]
    try:
        jobs = expand_sweep(overrides) if multirun else [overrides]
        if multirun:
            target = str(compose(conf_dir, jobs[0], config_name, hydra_config=True).hydra.launcher.get("_target_", ""))
            if "submitit" in target.lower():
                return None
        nproc = None
        for job in jobs:
            cfg = compose(conf_dir, job, config_name)
            nproc = int(cfg.launcher.nproc_per_node)
            if nproc <= 0:
                raise UsageError(f"launcher.nproc_per_node must be positive, got {nproc}")
            validator = VALIDATORS.get(str(cfg.workload.name))
            if validator is not None:
                import importlib

                with config_errors():
                    importlib.import_module(validator).validate(cfg, nproc)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code

    return torchrun(["--standalone", f"--nproc_per_node={nproc}", script, *argv])


def torchrun(args: list[str]) -> int:
    """torchrun in this process; a failed rank becomes one line and its exit code instead
    of torch's ChildFailedError traceback (the rank printed its own message already)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    try:
        run(get_args_parser().parse_args(args))
    except ChildFailedError as e:
        rank, first = min(e.failures.items(), key=lambda kv: kv[1].timestamp)
        print(f"error: rank {rank} exited with code {first.exitcode}; its message is above", file=sys.stderr)
        return first.exitcode if first.exitcode > 0 else 1
    return 0


def add_override(argv: list[str], override: str) -> None:
    """Add `override` beside the command line's other overrides. Hydra's parser (argparse)
    takes overrides as one run of positionals: one placed before a flag such as -m would
    leave the rest "unrecognized" (`launch/collectives.py -m trial=0,1` used to fail so)."""
    at = next((i for i, a in enumerate(argv[1:], 1) if "=" in a and not a.startswith("-")), len(argv))
    argv.insert(at, override)


def _report_job_error(overrides: list[str]) -> None:
    """Hydra's own "Error executing job" line and traceback, through the one redaction
    (workloads/core/records.py): Hydra would print the overrides as given, secrets and all."""
    import traceback

    from workloads.core.records import redact, redact_text

    print(f"Error executing job with overrides: {redact(list(overrides))}", file=sys.stderr)
    print(redact_text(traceback.format_exc()), file=sys.stderr, end="", flush=True)


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
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    from workloads.core.rundir import register_resolvers

    register_resolvers()
    if workload and not any(a.lstrip("+~").startswith("workload=") for a in sys.argv[1:]):
        add_override(sys.argv, f"workload={workload}")
    if os.environ.get("RANK", "0") != "0":
        add_override(sys.argv, "hydra/hydra_logging=disabled")  # one "Launching N jobs" banner, from rank 0

    @hydra.main(config_path=CONF_DIR, config_name=config_name, version_base="1.3")
    def main(cfg: DictConfig) -> None:
        overrides = list(HydraConfig.get().overrides.task)
        try:
            with config_errors():
                code = run(cfg, overrides)
        except UsageError as e:
            if _should_say(e):
                print(f"error: {e}", file=sys.stderr, flush=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            print("interrupted: measured points are kept", file=sys.stderr, flush=True)
            sys.exit(130)
        except Exception:  # a bug: its traceback, as Hydra would print it, minus secrets
            _report_job_error(overrides)
            sys.exit(1)
        if code:
            sys.exit(code)

    if distributed and not launched():
        code = self_launch(script, sys.argv[1:], CONF_DIR, config_name)
        if code is not None:
            sys.exit(code)
    elif launched():
        _compose_or_exit(sys.argv[1:], config_name)
    main()


def _compose_or_exit(argv: list[str], config_name: str) -> None:
    """Under torchrun/Slurm, a config that does not compose is one line from one rank per
    node and exit 2, as everywhere else (Hydra itself would print its message per rank)."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if not a.startswith("-") and not a.startswith("hydra/hydra_logging=")]
    try:
        for job in expand_sweep(overrides) if multirun else [overrides]:
            compose(CONF_DIR, job, config_name)
    except UsageError as e:
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
