"""Where a run's wall time goes: a few marks on one clock that starts when the run was launched.

A study's cell, a self-launch or an emulated run sets FB_T0 (epoch seconds) when its first
process starts; every process of the run inherits it. A rank marks its own process start
(`process`: the fork, or the exec from /proc), its process group (`group`), the start and end of
its measured window (`window`, `window_end`: the first and last timed step, the span the NIC
counters read) and the moment its record is closed (`record`). The record carries them as
seconds since the launch (`timeline`), so the start-up that a trial repeats is read from the
records themselves: launch -> process (interpreter, imports or the fork), process -> group
(rendezvous, communicator), group -> window (model, data, warm-up), window -> window_end
(what was measured), window_end -> record.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from workloads.core.forkrank import FORKED_AT_ENV

T0_ENV = "FB_T0"
ORDER = ("process", "group", "window", "window_end", "record")
_marks: dict[str, float] = {}


def _process_start() -> float | None:
    """This process's start in epoch seconds (/proc: ticks since boot, plus the boot time)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def begin() -> None:
    """In a run's first process (a launcher): the run's clock starts at this process's start,
    unless a caller (the study) started it before."""
    if T0_ENV not in os.environ:
        t = _process_start()
        os.environ[T0_ENV] = f"{t if t is not None else time.time():.3f}"


def mark(name: str, t: float | None = None) -> None:
    """The first time `name` happens in this process (a sweep's later points keep the first)."""
    _marks.setdefault(name, time.time() if t is None else t)


def window(t_start: float, t_end: float) -> None:
    """The measured window of the point being measured, in epoch seconds (the first timed step's
    start, the last one's end): each point of a sweep its own."""
    _marks["window"], _marks["window_end"] = t_start, t_end


def stamp(record: dict) -> None:
    """The record's `timeline`: marks as seconds since the launch; absent when no launcher set the
    clock (a rank under a raw torchrun measures no launch)."""
    try:
        t0 = float(os.environ[T0_ENV])
    except (KeyError, ValueError):
        return
    if "process" not in _marks:
        forked = os.environ.get(FORKED_AT_ENV)  # a fork's /proc start is its launcher's
        t = float(forked) if forked else _process_start()
        if t is not None:
            _marks["process"] = t
    _marks["record"] = time.time()
    record["timeline"] = {name: round(_marks[name] - t0, 3) for name in ORDER if name in _marks}
    record["timeline"]["rank_start"] = "fork" if os.environ.get(FORKED_AT_ENV) else "exec"
