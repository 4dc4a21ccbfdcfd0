"""Composing and checking a Hydra config, for whatever needs one: the entry points, the study,
the emulator, doctor. Every problem is a UsageError of one line (Hydra's own messages are
several, with a hint about HYDRA_FULL_ERROR); the entry machinery that prints it lives on the top
floor (workloads/commands/entry.py)."""

from __future__ import annotations

import contextlib
import math

from workloads import catalog
from workloads.core.errors import UsageError


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Every job of a basic-sweeper multirun, as lists of plain overrides."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise _override_error(overrides, e) from None
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
        raise _override_error(overrides, e) from None


def _override_error(overrides: list[str], e: Exception) -> UsageError:
    """Hydra's message, on one line, naming the override it could not parse when there is one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if "Available options in" in text:  # Hydra lists a group's options one per line: keep them on ours
        options = text.split("Available options in", 1)[1].split("Config search path")[0].splitlines()[1:]
        return UsageError(f"{first}; choose one of: {', '.join(o.strip() for o in options if o.strip())}")
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.startswith(("See https", "Set the env"))]
    first = " ".join(lines[:2]) or first
    for o in overrides:
        try:
            OverridesParser.create().parse_overrides([o])
        except HydraException:
            return UsageError(f"cannot parse the override {o!r} ({first}); write key=value, quoting lists "
                              "and spaces for the shell, e.g. 'load.points=[1,2]'")
    return UsageError(first)


@contextlib.contextmanager
def config_errors():
    """A config value that cannot be resolved or converted is the user's to fix: one line."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except OmegaConfBaseException as e:
        raise UsageError(f"config: {str(e).splitlines()[0]}") from None


def validate_job(cfg, world: int) -> None:
    """The workload's own checks of one job's config, for `world` ranks (UsageError)."""
    import importlib

    validator = catalog.field(str(cfg.workload.name), "validator")
    if validator is not None:
        with config_errors():
            importlib.import_module(validator).validate(cfg, world)


def add_override(argv: list[str], override: str) -> None:
    """Add `override` beside the command line's other overrides. Hydra's parser (argparse)
    takes overrides as one run of positionals: one placed before a flag such as -m would
    leave the rest "unrecognized" (`launch/collectives.py -m trial=0,1` used to fail so)."""
    at = next((i for i, a in enumerate(argv[1:], 1) if "=" in a and not a.startswith("-")), len(argv))
    argv.insert(at, override)


def hydra_value(v) -> str:
    """A value in Hydra's override grammar; strings quoted, so a~aa, n[1-2] or a path with
    spaces or commas pass as themselves."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float) and math.isfinite(v):
        return repr(v)  # a float stays a float in the record (repr round-trips it exactly)
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"
