"""The fingerprint a record carries: the hardware and software a run measured on, the code
(its commit and a hash of uncommitted edits, part of a run's identity: analysis/guard.py) and
the container it ran in."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import socket
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from workloads import REPO_ROOT


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=1)
def git_commit() -> dict[str, Any]:
    """The code a run measured: the commit, and a hash of the uncommitted changes to tracked
    files (`dirty_hash`, None when there are none). A commit alone would pool a run of an
    edited checkout with the clean runs of the same commit; the hash makes the edit identity
    (analysis/guard.py), as a commit is. Untracked files are not code git knows of: results,
    caches and local configs lie there."""
    commit = _run(["git", "rev-parse", "HEAD"], REPO_ROOT)
    if commit is None and os.environ.get("FABRICBENCH_GIT_COMMIT"):
        # an image holds no .git: tools/image.sh baked in the checkout's commit and edit hash
        dirty_hash = os.environ.get("FABRICBENCH_GIT_DIRTY_HASH") or None
        return {"commit": os.environ["FABRICBENCH_GIT_COMMIT"], "dirty": dirty_hash is not None,
                "dirty_hash": dirty_hash}
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], REPO_ROOT)
    diff = _run(["git", "diff", "HEAD", "--binary", "--no-ext-diff", "--no-color"], REPO_ROOT) if dirty else None
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None,
            "dirty_hash": hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None}


def site_settings(fabric: str | None, local: Path | None = None) -> dict[str, str] | None:
    """The site settings a run of `fabric` composed (conf/local/default.yaml, over every profile,
    and conf/local/<fabric>.yaml, over that profile only): path -> a hash of its text. They are
    git-ignored, so not in `git`'s dirty hash: a site's HCA names are where the code runs, not
    other code; the values themselves are in the record's config. None when there are none."""
    local = REPO_ROOT / "conf" / "local" if local is None else local
    out = {}
    for name in ("default", fabric):
        p = local / f"{name}.yaml"
        if name and "/" not in name and p.is_file():
            try:
                out[f"conf/local/{p.name}"] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            except OSError:
                continue
    return out or None


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return None


def cpu_affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None  # not Linux


def container_identity(root: str = "/") -> dict[str, Any] | None:
    """The container this process runs in, as its runtime announces it, or None on a host: a
    record made in a container must say so (its devices, limits and /dev/shm are the
    container's, docs/cluster.md). podman writes /run/.containerenv (engine, name, image and
    imageid when run as root; empty under some runtimes), docker /.dockerenv, Apptainer sets
    APPTAINER_CONTAINER (the image), and podman, systemd-nspawn and enroot set `container`. The
    project's images also carry their tag (FABRICBENCH_IMAGE, baked in by tools/image.sh) and a
    run may pass the image's id (FABRICBENCH_IMAGE_ID, which `make image`'s run line sets and
    tools/oci_bundle.sh writes into a bundle). Always the same keys (runtime, image, image_id,
    name), unknown ones null, so records from different runtimes have one shape."""
    r = Path(root)
    baked = {"image": os.environ.get("FABRICBENCH_IMAGE") or None,
             "image_id": os.environ.get("FABRICBENCH_IMAGE_ID") or None}
    image = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if image:
        return {"runtime": "apptainer", "image": image, "image_id": baked["image_id"], "name": None}
    try:
        text = (r / "run" / ".containerenv").read_text()
    except OSError:
        text = None
    if text is not None:
        kv = dict(re.findall(r'^(\w+)="([^"]*)"$', text, re.M))
        return {"runtime": kv.get("engine", "podman"), "image": kv.get("image") or baked["image"],
                "image_id": kv.get("imageid") or baked["image_id"], "name": kv.get("name") or None}
    if (r / ".dockerenv").exists():
        return {"runtime": "docker", **baked, "name": None}
    if os.environ.get("container"):
        return {"runtime": os.environ["container"], **baked, "name": None}
    return None


@lru_cache(maxsize=1)
def fingerprint() -> dict[str, Any]:
    """Hardware and software this process runs on. Cached: it does not change mid-run."""
    import torch

    cpu = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fp: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": cpu_affinity(),  # CPUs this process may run on (a Slurm task may get one)
        "container": container_identity(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "fabricbench": _version("fabricbench"),
        "git": git_commit(),
        "gpu": None,
        "gpu_count": 0,
        "driver": None,
        "nccl": None,
    }
    if torch.cuda.is_available():
        fp["gpu"] = torch.cuda.get_device_name(0)
        fp["gpu_count"] = torch.cuda.device_count()
        try:
            fp["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
        fp["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if fp["driver"]:
            fp["driver"] = fp["driver"].splitlines()[0]
    return fp
