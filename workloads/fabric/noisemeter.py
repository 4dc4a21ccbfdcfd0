"""What a rank measures of the emulator's background noise around one point: the iperf3
receivers' bytes (rchar of /proc/<pid>/io) or the CPU hogs' CPU time (/proc/<pid>/stat).

Apart from the noise generator (workloads/fabric/noise.py, which starts iperf3 and the hogs in
the emulated nodes' namespaces): every workload's point reads this meter (session.Recorded),
so a plain training run imports no iperf3, namespace or topology code. The generator tells the
ranks what to read through the file NOISE_ENV names (its pids, the counter, the description).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from workloads.core import procstat

NOISE_ENV = "FABRICBENCH_NOISE"


def received_bytes(pids: Sequence[int]) -> int | None:
    """Bytes the processes have read (rchar of /proc/<pid>/io, summed); None when one is unreadable."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                if line.startswith("rchar:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            return None
    return total


def rate_figures(moved: int, seconds: float) -> dict[str, float]:
    return {"bytes": moved, "seconds": seconds, "throughput(Mbit/s)": moved * 8 / seconds / 1e6 if seconds > 0 else 0.0}


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """CPU time the processes have used (utime + stime of /proc/<pid>/stat, summed, in s); None
    when one is unreadable."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        fields = procstat.fields(pid)
        if fields is None:
            return None
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    return total / tick


def busy_figures(cpu_s: float, seconds: float) -> dict[str, float]:
    cpu_s = round(cpu_s, 3)  # clock ticks: the sum of two float divisions would carry binary noise
    return {"cpu_s": cpu_s, "seconds": seconds, "cores_busy": cpu_s / seconds if seconds > 0 else 0.0}


class PointMeter:
    """What a rank measures of the noise around one point (session.Recorded): the iperf3
    receivers' bytes, or the hogs' CPU time, as it enters and as it leaves. Inactive when this
    run has no noise."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        path = (os.environ if environ is None else environ).get(NOISE_ENV)
        self.state = json.loads(Path(path).read_text()) if path else None
        self.start = self._read()

    def _read(self) -> tuple[float | None, float]:
        if self.state is None:
            return None, time.monotonic()
        count = cpu_seconds if self.state["counter"] == "cpu" else received_bytes
        return count(self.state["pids"]), time.monotonic()

    def record(self) -> dict[str, Any] | None:
        """`fabric.noise` of the record: the description and what the noise did during the point."""
        if self.state is None:
            return None
        (b0, t0), (b1, t1) = self.start, self._read()
        out = {**self.state["spec"], "description": self.state["description"]}
        if b0 is None or b1 is None:
            out["during_point"] = None
            out["unmeasured"] = "the noise processes' /proc/<pid> could not be read (ended, or not root)"
        else:
            out["during_point"] = (busy_figures if self.state["counter"] == "cpu" else rate_figures)(b1 - b0, t1 - t0)
        return out

    def stamp(self, rec: dict[str, Any]) -> None:
        """Put `fabric.noise` in the record: the noise this point ran under, and what it did meanwhile."""
        if (loud := self.record()) is not None and isinstance(rec.get("fabric"), dict):
            rec["fabric"]["noise"] = loud
