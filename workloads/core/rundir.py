"""Where a run's files go, agreed by every rank without talking to each other.

Hydra's `${now:}` differs per rank, so the run directory is derived from what all ranks
of one job share before the process group exists: an explicit `run_id`, Slurm's job id,
torchrun's rendezvous id, or (single-node torchrun with the default static rendezvous,
whose id is "none") the temporary directory of the torchrun agent that started them.
After init the ranks check that they agree (see workloads/core/dist.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

from workloads.core.errors import UsageError

# A run id every process of one run inherits (a self-launch's ranks, an emulated run's nodes, a
# study's cell), ahead of the launcher-derived ones below.
RUN_ID_ENV = "FABRICBENCH_RUN_ID"


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") or "run"


@lru_cache(maxsize=None)
def resolve_run_id(explicit: str | None = None) -> str:
    """Cached: the single-process fallback reads the clock, and Hydra and the workload
    must get the same answer within one process."""
    return derive_run_id(explicit, os.environ)


def check_run_id(run_id: str) -> str:
    """A run id names one folder under output_root: no separator, not `.` or `..`."""
    if "/" in run_id or "\\" in run_id or run_id in (".", "..") or "\0" in run_id:
        raise UsageError(f"run_id={run_id!r} must name one folder under output_root (no '/', '\\', '.' or '..'); "
                         "e.g. run_id=roce-8gpu")
    return run_id


def derive_run_id(explicit: str | None, env) -> str:
    if explicit not in (None, "", "None", "null"):
        return _safe(check_run_id(str(explicit)))
    if env.get(RUN_ID_ENV):
        return _safe(env[RUN_ID_ENV])
    if env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID")
        return _safe(f"slurm-{env['SLURM_JOB_ID']}" + (f".{step}" if step else ""))
    rdzv = env.get("TORCHELASTIC_RUN_ID", "")
    if rdzv and rdzv != "none":
        return _safe(f"rdzv-{rdzv}")
    err = env.get("TORCHELASTIC_ERROR_FILE")
    if err:
        # .../torchelastic_<rand>/<run_id>_<rand>/attempt_<n>/<local_rank>/error.json:
        # everything above <local_rank> is shared by the agent's local workers.
        agent_dir = Path(err).parent.parent
        try:
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(agent_dir.stat().st_mtime))
        except OSError:
            stamp = "torchrun"
        digest = hashlib.sha1(str(agent_dir).encode()).hexdigest()[:6]
        return f"{stamp}-{digest}"
    # A single process that launched nothing: its own start time and pid.
    return f"{time.strftime('%Y%m%d-%H%M%S')}-p{os.getpid()}"


def run_dir(output_root: str, run_id: str | None = None) -> str:
    return str(Path(output_root) / resolve_run_id(run_id))


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("fb_run_dir"):
        OmegaConf.register_new_resolver("fb_run_dir", lambda root, rid=None: run_dir(root, rid), use_cache=True)


def log_since(path, offset: int = 0) -> str | None:
    """The text a log got after byte `offset` (a rerun appends to the same log: only its own part
    says what it did); None when the log cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return None
