"""The opening and closing every distributed workload shares.

Opening (`start`): export the fabric's environment, create the process group once, and
agree on one run directory across ranks. Closing (`Recorded`): whatever happens inside,
the record says so, and the writing rank puts it on disk.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from workloads.core import dist as fdist
from workloads.core import rundir
from workloads.core.errors import UsageError
from workloads.fabric.profile import FabricProfile
from workloads.core.records import new_record, write_record


def start(cfg: DictConfig, fabric: FabricProfile) -> tuple[fdist.DistInfo, Path, dict[str, str]]:
    """Apply the fabric before init (NCCL reads its environment then), init once per
    process, and return (info, the run directory every rank uses, the env applied)."""
    run_dir = Path(rundir.run_dir(cfg.output_root, cfg.get("run_id")))
    applied_env = fabric.apply(run_dir)
    info = fdist.init_once(fabric.backend, fabric.name, float(cfg.dist.timeout_s))
    agreed, disagreeing = fdist.agree(str(run_dir), info)
    if disagreeing and info.is_main:
        print(f"warning: ranks {disagreeing} derived another run directory; records go to {agreed}. "
              "Pass run_id= (or torchrun --rdzv_id) so every node agrees.", flush=True)
    return info, Path(agreed), applied_env


def base_record(workload: str, cfg: DictConfig, fabric: FabricProfile, applied_env: dict[str, str],
                run_id: str, overrides: list[str] | None, **fields: Any) -> dict[str, Any]:
    """The fields every workload's record shares: identity, config, the fabric as applied,
    and the study cell (arm, block, position) when a study launched this run, so analysis
    can tell the design from the record alone."""
    study = cfg.get("study")
    return new_record(
        workload,
        run_id=run_id,
        overrides=list(overrides or []),
        config=OmegaConf.to_container(cfg, resolve=True),
        fabric={"name": fabric.name, "backend": fabric.backend, "env": applied_env, "expect": fabric.expect,
                "verify": fabric.verify},
        study=OmegaConf.to_container(study, resolve=True) if study is not None else None,
        **fields,
    )


class Recorded:
    """`with Recorded(record, dir, stem, write=info.is_main):` runs a measurement; on the
    way out the record's status is "ok", or "failed" with the error (and the traceback of
    anything that is not a UsageError), and it is written when `write` is true. The
    exception, if any, still propagates."""

    def __init__(self, record: dict[str, Any], directory: Path, stem: str, write: bool):
        self.record, self.directory, self.stem, self.write = record, directory, stem, write
        self.path: Path | None = None
        self.inflight: Path | None = None

    def __enter__(self) -> dict[str, Any]:
        if self.write:
            from workloads.core.launcher import write_inflight

            self.inflight = write_inflight(self.record, self.directory, self.stem)
        return self.record

    def __exit__(self, etype, exc, tb) -> bool:
        rec = self.record
        if exc is None:
            if rec.get("status") == "running":
                rec["status"] = "ok"
        elif isinstance(exc, UsageError):
            rec["status"], rec["error"] = "failed", str(exc)
        elif isinstance(exc, KeyboardInterrupt):
            rec["status"], rec["error"] = "failed", "interrupted (Ctrl-C or SIGTERM)"
        else:
            rec["status"], rec["error"] = "failed", f"{type(exc).__name__}: {exc}"
            rec["traceback"] = "".join(traceback.format_exception(etype, exc, tb))
        if self.write:
            self.path = write_record(self.directory, rec, self.stem)
            if self.inflight is not None:
                self.inflight.unlink(missing_ok=True)
        return False
