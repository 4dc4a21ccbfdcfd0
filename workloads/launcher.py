"""`python launch/<entry>.py ...` without torchrun: validate every sweep point's config
in this process (a bad value is one message, before any rank starts), then start
`launcher.nproc_per_node` local ranks with torchrun's own machinery and report a failed
rank in one line instead of torchrun's traceback."""

from __future__ import annotations

import sys

from workloads.errors import UsageError

# workload name -> module whose validate(cfg, world) checks a config before any rank starts
VALIDATORS = {
    "pretrain": "workloads.train",
    "finetune": "workloads.train",
    "collectives": "workloads.collectives.runner",
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


def compose(conf_dir: str, overrides: list[str]):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            return hcompose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise UsageError(str(e).strip()) from None


def self_launch(script: str, argv: list[str], conf_dir: str) -> int:
    multirun = any(a in ("-m", "--multirun") for a in argv)
    overrides = [a for a in argv if not a.startswith("-")]
    try:
        jobs = expand_sweep(overrides) if multirun else [overrides]
        nproc = None
        for job in jobs:
            cfg = compose(conf_dir, job)
            nproc = int(cfg.launcher.nproc_per_node)
            if nproc <= 0:
                raise UsageError(f"launcher.nproc_per_node must be positive, got {nproc}")
            validator = VALIDATORS.get(str(cfg.workload.name))
            if validator is not None:
                import importlib

                importlib.import_module(validator).validate(cfg, nproc)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(["--standalone", f"--nproc_per_node={nproc}", script, *argv])
    try:
        run(args)
    except ChildFailedError as e:
        first = min(e.failures.values(), key=lambda f: f.timestamp)
        print(f"error: rank {first.local_rank} exited with code {first.exitcode}; "
              "its message is above", file=sys.stderr)
        return first.exitcode if first.exitcode > 0 else 1
    return 0
