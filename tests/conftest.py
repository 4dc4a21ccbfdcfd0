"""Shared test helpers. Tests are CPU-only and use real processes and sockets."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """Environment for launched ranks: one thread each (2 cores), no W&B network."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"})
    env.pop("LOCAL_RANK", None)
    env.update(extra)
    return env


def run_entry(script: str, *overrides: str, torchrun: int | None = None, timeout: float = 300, env: dict | None = None,
              cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run launch/<script> with Hydra overrides; under torchrun when `torchrun` is a rank count,
    else with plain python (which validates, then self-launches launcher.nproc_per_node ranks)."""
    cmd = [sys.executable]
    if torchrun:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}"]
    cmd += [str(REPO / "launch" / script), *overrides]
    return subprocess.run(cmd, cwd=cwd, env=env or child_env(), capture_output=True, text=True, timeout=timeout)


def records_in(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(root).rglob("records/*.json"))]


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an exited child not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def gone(pids, within_s: float = 30) -> bool:
    """Every one of `pids` ended within `within_s`."""
    deadline = time.monotonic() + within_s
    while any(alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(x) for x in pids)


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    return tmp_path / "results"


@contextlib.contextmanager
def tmpfs(where: Path, options: str = "size=1m"):
    """A small tmpfs mounted at `where` (a new folder) for the block, unmounted after: a full
    or read-only disk for real. Root only: a test without it is skipped."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
