"""Shared test helpers. Tests are CPU-only and use real processes and sockets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    return tmp_path / "results"
