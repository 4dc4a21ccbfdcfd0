"""Why torch sees no CUDA GPU on a machine that has some: the NVIDIA driver is older than
the one the installed torch's CUDA needs. One line that names the driver to install, where
"this machine has no GPU" would send the user looking for the wrong problem.

The minimum driver per CUDA major (NVIDIA, "CUDA Compatibility", Minor Version Compatibility,
Table 1): CUDA 13.x >= R580, 12.x >= R525, 11.x >= R450. The lock's torch is built on CUDA 13.
"""

from __future__ import annotations

import subprocess

MIN_DRIVER = {13: 580, 12: 525, 11: 450}
SOURCE = "NVIDIA CUDA Compatibility, minor version compatibility table"


def nvidia_driver() -> str | None:
    """The driver version nvidia-smi reports for GPU 0, or None (no nvidia-smi, no GPU)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def driver_problem(driver: str | None, torch_cuda: str | None) -> str | None:
    """The sentence that explains an unusable GPU by the driver, or None when the driver is
    absent (no NVIDIA GPU), new enough, or unreadable."""
    try:
        have = int(str(driver).split(".")[0])
        major = int(str(torch_cuda).split(".")[0])
    except ValueError:
        return None
    need = MIN_DRIVER.get(major)
    if need is None or have >= need:
        return None
    older = max((m for m, d in MIN_DRIVER.items() if d <= have), default=None)
    fix = f", or a torch built for CUDA {older}" if older else ""
    return (f"the NVIDIA driver is {driver}, older than the R{need} that this torch's CUDA {torch_cuda} needs "
            f"({SOURCE}); install driver R{need} or newer{fix}")
