"""Engines replaced at the process boundary (they need a GPU here): a stand-in that records the
argv and environment it was started with, and an engine image's interpreter without
fabricbench's dependencies."""

from __future__ import annotations

import sys
from pathlib import Path

# Variables a test's own environment may carry that an engine node must get only from us.
ENGINE_VARS = ("NCCL_", "SLURM_", "FB_", "FABRICBENCH_")


def stand_in(path: Path, seen: Path) -> Path:
    """An engine (it needs a GPU) replaced at the process boundary: it records the argv and
    environment it was started with."""
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"json.dump({{'env': dict(os.environ), 'argv': sys.argv}}, open({str(seen)!r}, 'w'))\n")
    path.chmod(0o755)
    return path


def engine_python_without_hydra(bindir: Path) -> None:
    """`python3`/`python` as in the sglang/vllm images: the engine's interpreter, without
    fabricbench's dependencies (-S: no site-packages, so no hydra)."""
    bindir.mkdir(exist_ok=True)
    for name in ("python3", "python"):
        (bindir / name).write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
        (bindir / name).chmod(0o755)
