"""A study's runs hold one shared lock for as long as any of their processes lives.

A study killed with SIGKILL cannot stop the cell it was running: that cell's launcher and
ranks (and, after a `kill -9` of the launcher too, its ranks) live on. Resumed at once, the
study would run the same cell beside them, and both measure the contention (seen: 176.6
samples/s against 330-348 for every other cell, counted as a good trial). So every process
of a cell holds a shared flock on `<study folder>/.cells.lock`: the cell's first process
inherits the study's open file (the lock belongs to the open file, not to a process), and each
fabricbench process below it (launcher, torchrun agent, ranks) takes its own when it starts,
named by FABRICBENCH_CELL_LOCK in its environment. A study takes that lock exclusively before
it starts any cell, which it can only do once every process of every earlier run has ended.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Callable, TextIO

CELL_LOCK_ENV = "FABRICBENCH_CELL_LOCK"
NAME = ".cells.lock"

_held: TextIO | None = None  # this process's own shared lock, kept open for its whole life


def hold_shared() -> None:
    """In a process a study started (directly or below): take the cell lock, shared, for as
    long as this process lives. Not in a study: nothing. A lock that cannot be opened (the
    folder gone) is not this run's problem: the study that waits on it would see it gone too."""
    global _held
    path = os.environ.get(CELL_LOCK_ENV)
    if not path or _held is not None:
        return
    try:
        f = open(path, "a")
        fcntl.flock(f, fcntl.LOCK_SH)
    except OSError:
        return
    _held = f


def holders(path: Path) -> list[int]:
    """Pids of the processes that have `path` open (read from /proc; those of other users that
    this process may not read are not listed)."""
    target = str(path.resolve())
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        if int(d.name) == os.getpid():
            continue
        try:
            fds = list((d / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    out.append(int(d.name))
                    break
            except OSError:
                continue
    return sorted(out)


def describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    words = [a.decode(errors="replace") for a in argv if a][:3]
    return f"pid {pid} ({' '.join(words)[:80]})"


def acquire(folder: Path, wait_s: float, say: Callable[[str], None], poll_s: float = 0.2) -> TextIO | None:
    """The study's lock on its cells: exclusive once no process of an earlier run holds it,
    then shared, so that the cells it starts inherit it. Waits up to `wait_s` (an orphaned run
    that got SIGTERM from its dead study is writing its interrupted record), saying once whom
    it waits for. None when the earlier runs still live after that: the caller refuses."""
    f = open(folder / NAME, "a")
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                f.close()
                return None
            if not said:
                who = ", ".join(describe(p) for p in holders(folder / NAME)) or "a process of another user"
                say(f"waiting up to {wait_s:.0f} s for the run(s) of an earlier attempt of this study to end: {who}")
                said = True
            time.sleep(poll_s)
    fcntl.flock(f, fcntl.LOCK_SH)  # the cells started from now on share it
    global _held
    _held = f
    return f


def inherited() -> tuple[int, ...]:
    """The fd a study's child keeps open (Popen's pass_fds): the study's own shared lock, so
    the cell holds it from its first instruction, whatever language it is written in."""
    return (_held.fileno(),) if _held is not None else ()


def die_with_parent() -> None:
    """A Popen preexec_fn: SIGTERM when the study dies, SIGKILL included (PR_SET_PDEATHSIG;
    the study starts its cells from its main thread, whose end is the process's end). The cell
    handles SIGTERM as an interruption: its point's record says so, and it stops its ranks."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1: PR_SET_PDEATHSIG


def release(f: TextIO) -> None:
    """The study is done with its cells (its children keep their own share while they live)."""
    global _held
    if _held is f:
        _held = None
    f.close()
