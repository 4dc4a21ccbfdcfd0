"""Fabric profiles: the backend, the environment a run exports, what transport it expects.

A profile is data (conf/fabric/*.yaml); adding a fabric needs no code. Its environment
must be applied before the process group exists, because NCCL reads it at init.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from workloads.core.errors import UsageError

BACKENDS = ("gloo", "nccl")  # nccl is RCCL on ROCm builds of torch
VERIFY_MODES = ("fail", "warn", "off")


def _env_value(v: Any) -> str | None:
    # A Hydra list override (NCCL_IB_HCA=[mlx5_0,mlx5_1]) means NCCL's comma list.
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return None if v is None else str(v)


def check_env_name(name: str) -> None:
    """A NCCL_/GLOO_ name the library does not read is a typo until the user says otherwise:
    exported, it would be ignored without a word and the run would go on with the default
    (another interface, another transport) under the profile's label."""
    import difflib

    from workloads.fabric.envnames import KNOWN

    for prefix, (library, names) in KNOWN.items():
        # environment names are case-sensitive: a lower-case gloo_socket_ifname is exported and read by no one
        if name.upper().startswith(prefix) and name != name.upper() and name.upper() in names:
            raise UsageError(f"fabric.env.{name}: {library} reads no such variable (names are case-sensitive: did you "
                             f"mean {name.upper()}?); fix the name")
        if name.startswith(prefix) and name not in names:
            near = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
            guess = f" (did you mean {near[0]}?)" if near else ""
            raise UsageError(f"fabric.env.{name}: {library} reads no such variable{guess}; fix the name, or pass "
                             f"+fabric.env_unchecked=[{name}] if it is deliberate (a variable newer than "
                             "workloads/fabric/envnames.py)")


def check_nccl_values(env: Mapping[str, str | None], where: str, ctx=None) -> None:
    """NCCL variables the NCCL that will run ignores (a name it no longer or not yet reads, an
    integer it reads as another) or fails on (NCCL_ALGO/NCCL_PROTO), refused in one line.
    Without a context (a profile alone) only what fails whatever the workload is checked."""
    from workloads.fabric import ncclvalues

    if not any(k.startswith("NCCL_") and v is not None for k, v in env.items()):
        return
    got = ncclvalues.problems(dict(env), ctx or ncclvalues.Context(functions=frozenset()),
                              ncclvalues.runtime_version())
    if got:
        raise UsageError(f"{where}.{got[0]}")


@dataclass(frozen=True)
class FabricProfile:
    name: str
    backend: str
    env: dict[str, str | None] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)
    verify: str = "fail"
    emulate: dict[str, Any] | None = None  # set for emulated fabrics (workloads/fabric/netns.py builds them)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> FabricProfile:
        backend = str(cfg.get("backend", "")).lower()
        if backend not in BACKENDS:
            raise UsageError(
                f"fabric '{cfg.get('name')}' names backend '{backend}'; use one of {', '.join(BACKENDS)}"
            )
        verify = str(cfg.get("verify", "fail"))
        if verify not in VERIFY_MODES:
            raise UsageError(f"fabric.verify={verify!r}; use one of {', '.join(VERIFY_MODES)}")
        env = {str(k): _env_value(v) for k, v in dict(cfg.get("env") or {}).items()}
        unchecked = {str(n) for n in cfg.get("env_unchecked") or ()}
        for key, value in env.items():
            if value is not None and key not in unchecked:  # unsetting a name exports nothing
                check_env_name(key)
        check_nccl_values({k: v for k, v in env.items() if k not in unchecked}, "fabric.env")
        return cls(
            name=str(cfg["name"]),
            backend=backend,
            env=env,
            expect=dict(cfg.get("expect") or {}),
            verify=verify,
            emulate=dict(cfg["emulate"]) if cfg.get("emulate") else None,
        )

    def check_backend_usable(self) -> None:
        if self.backend == "nccl":
            import torch

            if not torch.cuda.is_available():
                from workloads.core.driver import driver_problem, nvidia_driver

                if problem := driver_problem(nvidia_driver(), torch.version.cuda):
                    raise UsageError(f"fabric={self.name} uses backend nccl, and torch sees no GPU: {problem}")
                raise UsageError(
                    f"fabric={self.name} uses backend nccl, which needs a GPU, and this machine "
                    "has none (torch.cuda.is_available() is False); use fabric=loopback on CPU"
                )

    def overwritten(self, environ: Mapping[str, str]) -> list[str]:
        """One line per variable exported in `environ` that the profile sets to another value
        (or unsets). The profile wins: a study's arms share one environment, so an exported
        NCCL_IB_HCA would otherwise reach the other fabric's arm too, and the record's config
        would name values the run did not use (docs/fabrics.md, "Exported variables")."""
        lines = []
        for key, value in self.env.items():
            if key in environ and environ[key] != value:
                now = "unsets it" if value is None else f"sets {value}"
                lines.append(f"fabric={self.name}: exported {key}={environ[key]} is overwritten: the profile {now} "
                             f"(the profile wins; put it in conf/local/{self.name}.yaml or pass fabric.env.{key}=...)")
        return lines

    def apply(self, run_dir: str | os.PathLike | None, environ: dict | None = None, say=None) -> dict[str, str]:
        """Export the profile's variables (a None value unsets one) and, for NCCL, turn on
        its INFO log into one file per process. Returns exactly what was applied. An exported
        variable the profile overwrites is said, one line each, by `say` (default: stderr on
        each node's first local rank)."""
        environ = os.environ if environ is None else environ
        if say is None and environ.get("LOCAL_RANK", "0") == "0":
            def say(line):
                print(f"warning: {line}", file=sys.stderr, flush=True)
        for line in self.overwritten(environ):
            if say is not None:
                say(line)
        applied: dict[str, str] = {}
        for key, value in self.env.items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value
                applied[key] = value
        if self.backend == "nccl" and run_dir is not None:
            logs = Path(run_dir) / "nccl"
            logs.mkdir(parents=True, exist_ok=True)
            defaults = {
                "NCCL_DEBUG": "INFO",
                # BOOTSTRAP: 2.2x moved "Bootstrap: Using" under its own subsystem.
                # Not TUNING by default: NCCL logs it on every collective call, a file write
                # inside the timed loop; add it (fabric.env.NCCL_DEBUG_SUBSYS) to see the
                # algorithm behind a busbw above the line rate (linerate.py).
                "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,NET,GRAPH,ENV",
                # %h host, %p pid: NCCL expands them, so ranks never share a file.
                "NCCL_DEBUG_FILE": str(logs / "nccl.%h.%p.log"),
            }
            for key, value in defaults.items():
                environ.setdefault(key, value)
                applied[key] = environ[key]
        return applied


def compose_node(overrides: list[str]):
    """A served job's config as one node of it composes it (the same conf/ tree and overrides as
    node 0's launch/infer.py, which selects workload=inference), outside a Hydra run."""
    from workloads import CONF_DIR, catalog
    from workloads.core.config import compose

    if not catalog.chooses_workload(overrides):
        overrides = ["workload=inference", *overrides]
    return compose(CONF_DIR, list(overrides))


def node_env(overrides: list[str], cfg=None) -> tuple[FabricProfile, dict[str, str | None]]:
    """The fabric profile and the environment one node of a job must run with: the profile's
    variables and NCCL's per-process log under the job's run directory (the run id from
    FABRICBENCH_RUN_ID/Slurm, as node 0 derives it). None means unset. `cfg`: the config
    already composed from `overrides`."""
    from omegaconf import OmegaConf

    from workloads.core import rundir

    cfg = compose_node(overrides) if cfg is None else cfg
    fabric = FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))
    env: dict = {}
    for line in fabric.overwritten(os.environ):  # this node's exported values lose, as node 0's do
        print(f"warning: {line}", file=sys.stderr, flush=True)
    fabric.apply(Path(rundir.run_dir(cfg.output_root, cfg.get("run_id"))).resolve(), env, say=lambda line: None)
    unset = {k: None for k, v in fabric.env.items() if v is None}
    return fabric, {**env, **unset}


def exec_with(env: dict[str, str | None], command: list[str]) -> int:
    """Replace this process with `command` under `env` (None unsets); 2 and one line if it
    cannot start."""

    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"error: cannot run {command[0]}: {e.strerror}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """python -m workloads.fabric.profile exec [hydra overrides] -- command ...

    Runs `command` with the fabric profile applied, exactly as node 0's workload applies it
    (launch/slurm/serve_node.sh starts the engine workers of nodes > 0 this way)."""

    from workloads.core.errors import UsageError

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "exec" or "--" not in args or args.index("--") == len(args) - 1:
        print("usage: python -m workloads.fabric.profile exec [hydra overrides] -- command [args]", file=sys.stderr)
        return 2
    cut = args.index("--")
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        _, env = node_env(args[1:cut])
    except (UsageError, HydraException, OmegaConfBaseException) as e:
        print(f"error: {str(e).splitlines()[0]} (overrides: {' '.join(args[1:cut]) or 'none'})", file=sys.stderr)
        return 2
    return exec_with(env, args[cut + 1:])


if __name__ == "__main__":
    raise SystemExit(main())
