"""Fabric profiles: the backend, the environment a run exports, what transport it expects.

A profile is data (conf/fabric/*.yaml); adding a fabric needs no code. Its environment
must be applied before the process group exists, because NCCL reads it at init.
"""

from __future__ import annotations

import os
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


@dataclass(frozen=True)
class FabricProfile:
    name: str
    backend: str
    env: dict[str, str | None] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)
    verify: str = "fail"
    emulate: dict[str, Any] | None = None  # set for emulated fabrics (workloads/fabric/emulate.py builds them)

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
                raise UsageError(
                    f"fabric={self.name} uses backend nccl, which needs a GPU, and this machine "
                    "has none (torch.cuda.is_available() is False); use fabric=loopback on CPU"
                )

    def apply(self, run_dir: str | os.PathLike | None, environ: dict | None = None) -> dict[str, str]:
        """Export the profile's variables (a None value unsets one) and, for NCCL, turn on
        its INFO log into one file per process. Returns exactly what was applied."""
        environ = os.environ if environ is None else environ
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
                # BOOTSTRAP: 2.2x moved "Bootstrap: Using" under its own subsystem
                "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,NET,GRAPH,ENV",
                # %h host, %p pid: NCCL expands them, so ranks never share a file.
                "NCCL_DEBUG_FILE": str(logs / "nccl.%h.%p.log"),
            }
            for key, value in defaults.items():
                environ.setdefault(key, value)
                applied[key] = environ[key]
        return applied
