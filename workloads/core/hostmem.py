"""How much host memory this process may still allocate: the one reading every fit check uses.

Two limits apply and either can be the smaller: the machine's `MemAvailable` (shared with
every other job on the node) and this process's own address-space limit (`ulimit -v`,
`prlimit --as`, some batch systems' memory limit), of which the process already uses its
`VmSize`. A check that read only MemAvailable passed under `ulimit -v` and the allocation
then failed deep inside the allocator with a long traceback.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass


@dataclass(frozen=True)
class Headroom:
    bytes: int
    where: str  # what limits it, for the error line: "MemAvailable" or "RLIMIT_AS, ulimit -v"

    def gib(self) -> str:
        return f"{self.bytes / 2**30:.2f} GiB"


def _status_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def headroom(shared_by: int = 1, meminfo: str = "/proc/meminfo", status: str = "/proc/self/status") -> Headroom | None:
    """The smaller of this process's share of MemAvailable (`shared_by` processes of one job on
    this node draw on it) and its own RLIMIT_AS soft limit less VmSize; None when neither is known."""
    out = []
    avail = _status_kib(meminfo, "MemAvailable")
    if avail is not None:
        share = f"MemAvailable / {shared_by} ranks" if shared_by > 1 else "MemAvailable"
        out.append(Headroom(avail // max(1, shared_by), share))
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        used = _status_kib(status, "VmSize") or 0
        out.append(Headroom(max(0, soft - used), "RLIMIT_AS, ulimit -v"))
    return min(out, key=lambda h: h.bytes) if out else None


def oom_kills(vmstat: str = "/proc/vmstat", cgroups: str = "/proc/self/cgroup",
              root: str = "/sys/fs/cgroup") -> tuple[int | None, int | None]:
    """The kernel's counts of processes its out-of-memory killer ended: the host's (/proc/vmstat
    oom_kill) and this process's cgroup's, its children's included (cgroup v2 memory.events
    oom_kill: a container's or a Slurm job's limit). A rank's SIGKILL with either count grown
    meanwhile was the OOM killer's, not a user's `kill -9`. None where a count is not readable."""
    def count(path: str, key: str) -> int | None:
        try:
            for line in open(path):
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            return None
        return None

    group = None
    try:
        for line in open(cgroups):
            if line.startswith("0::"):  # the unified (v2) hierarchy
                group = f"{root}/{line[3:].strip().lstrip('/')}/memory.events"
    except OSError:
        pass
    return count(vmstat, "oom_kill"), (count(group, "oom_kill") if group else None)


def oom_killed_since(before: tuple[int | None, int | None], now: tuple[int | None, int | None] | None = None) -> bool:
    """Whether the OOM killer ended a process since `before` (oom_kills())."""
    now = oom_kills() if now is None else now
    return any(a is not None and b is not None and b > a for a, b in zip(before, now))
