"""Result records: one JSON file per measured point, written atomically, never overwritten.

The record is the contract between workloads and analysis/: the config, the fabric
environment as applied, the transport seen, the hardware/software fingerprint, metrics,
raw samples and status. Secrets never enter it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

from workloads import REPO_ROOT
from workloads.core.errors import UsageError

SCHEMA = "fabricbench.record/1"
# Whole words of a key name: WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY match;
# tokens_per_sec and max_tokens do not.
_SECRET_WORDS = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTHORIZATION"}


def is_secret_name(name: str) -> bool:
    return any(w in _SECRET_WORDS for w in re.split(r"[^A-Za-z0-9]+", str(name).upper()))


_ASSIGNMENT = re.compile(r"^([+~]*[A-Za-z0-9_.\-/]+)=(.*)$", re.S)


def redact(obj: Any) -> Any:
    """Replace the value of every mapping key that looks like a secret, and of every
    `key=value` string (a Hydra override such as `+fabric.env.HF_TOKEN=...`) whose last
    key component does."""
    if isinstance(obj, dict):
        return {k: ("<redacted>" if is_secret_name(k) and v not in (None, "") else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        m = _ASSIGNMENT.match(obj)
        if m and is_secret_name(m.group(1).rsplit(".", 1)[-1]):
            return f"{m.group(1)}=<redacted>"
    return obj


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=1)
def git_commit() -> dict[str, Any]:
    commit = _run(["git", "rev-parse", "HEAD"], REPO_ROOT)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], REPO_ROOT)
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None}


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


def check_writable(root: str) -> None:
    p = Path(root)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"output directory {p} is not writable ({e.strerror}); set output_root= to a writable path") from None


def new_record(workload: str, **fields: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "schema": SCHEMA,
        "workload": workload,
        "status": "running",
        "error": None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    rec.update(fields)
    return rec


def write_record(directory: str | os.PathLike, record: dict[str, Any], stem: str) -> Path:
    """Write `record` as <directory>/<stem>-<n>.json atomically: a temp file, fsync, then a
    hard link that fails if the name exists (so nothing is ever overwritten)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{stem}.{uuid.uuid4().hex}.tmp"
    data = json.dumps(redact(record), indent=1, default=str, allow_nan=True)
    with open(tmp, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        for n in range(100000):
            final = d / f"{stem}-{n:03d}.json"
            try:
                os.link(tmp, final)
                return final
            except FileExistsError:
                continue
        raise RuntimeError(f"no free record name for {stem} in {d}")
    finally:
        tmp.unlink(missing_ok=True)


def load_records(*dirs: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record under the given directories (recursively), each with its `_path`."""
    out = []
    for d in dirs:
        for p in sorted(Path(d).rglob("*.json")):
            try:
                rec = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(rec, dict) and rec.get("schema", "").startswith("fabricbench.record"):
                rec["_path"] = str(p)
                out.append(rec)
    return out
