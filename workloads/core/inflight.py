"""In-flight records: the point being measured is on disk before its record is.

The writing rank (rank 0) keeps a copy of the record it is measuring, removed once the real
record is written. If it dies first (SIGKILL, the OOM killer, a crash in native code), the
copy becomes a failed record, written by whoever can tell that rank 0 is gone:

- under self-launch, the launcher, which also knows how the rank died (`recover`);
- under a raw torchrun (or Slurm), a surviving rank on rank 0's host: it learned rank 0's
  pid when the point began (`writer`, shared by Recorded.__enter__) and, when its own part of
  the point fails, finds that pid gone (`after_writer_died`).

Whoever claims a copy first (an atomic rename) writes the one record; a second finisher
finds nothing to claim, so a point never gets two records from this.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workloads.core import procstat, signals
from workloads.core.errors import RecordNotWritten

INFLIGHT_ENV = "FABRICBENCH_INFLIGHT_DIR"   # set by self_launch: its launcher recovers the copies there
SUFFIX = ".inflight"                        # not .json: no reader of records/ takes a copy for a record
# A peer's socket closes while the dying process is still being torn down: give /proc a moment
# to show it gone before deciding that rank 0 is alive (and so will write its own record).
DEATH_WAIT_S = 2.0


def _where(directory: Path) -> Path:
    """The launcher's folder under self-launch, else beside the records (a hidden folder)."""
    launcher = os.environ.get(INFLIGHT_ENV)
    return Path(launcher) if launcher else Path(directory) / ".inflight"


def planned(directory: Path, stem: str) -> Path:
    """Where this process keeps its copy of the record to be written into `directory` as `stem`."""
    return _where(directory) / f"{os.getpid()}-{stem}{SUFFIX}"


def write(record: dict, directory: Path, stem: str) -> Path:
    """Keep the writing rank's copy of `record` (to be written into `directory` as `stem`)."""
    path = planned(directory, stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps({"directory": str(Path(directory).resolve()), "stem": stem, "record": record},
                                  default=str))
        tmp.replace(path)
    finally:  # a full disk: no half-written .tmp is left behind
        tmp.unlink(missing_ok=True)
    return path


def discard(path: Path) -> None:
    """The copy is done with (its record written, or kept elsewhere): removed, and the hidden
    `.inflight/` folder beside the records with it once empty (empty ones piled up in run
    folders). A self-launch's folder is its launcher's to remove."""
    path.unlink(missing_ok=True)
    if path.parent.name == ".inflight":
        try:
            path.parent.rmdir()
        except OSError:
            pass  # another copy is in it (another rank's point), or it is gone already


def finish(path: Path, why: str) -> Path | None:
    """The copy at `path` as a failed record named by `why`; None when another finisher (or
    the writer itself, done after all) got there first."""
    from workloads.core.records import write_record

    claimed = path.with_name(f"{path.name}.{os.getpid()}.claimed")
    try:
        os.rename(path, claimed)  # atomic: of two finishers exactly one gets the copy
    except FileNotFoundError:
        return None
    try:
        left = json.loads(claimed.read_text())
        directory, record, stem = left["directory"], left["record"], left["stem"]
    except (OSError, ValueError, KeyError) as e:  # written atomically: only someone else's file can be so
        claimed.unlink(missing_ok=True)
        print(f"warning: {path} is not an in-flight copy ({type(e).__name__}: {e}); removed", file=sys.stderr)
        return None
    try:
        written = write_record(directory, record | {"status": "failed", "error": why}, stem)
    except RecordNotWritten as e:  # kept in a rescue folder (the warning says where), or nowhere
        if e.kept is None:
            os.rename(claimed, path)  # kept for a later finisher, and for the user
        else:
            claimed.unlink()
        print(f"warning: {e}" + ("" if e.kept else f"; the in-flight copy is kept at {path}"), file=sys.stderr,
              flush=True)
        return None
    except Exception as e:
        os.rename(claimed, path)  # kept for a later finisher, and for the user
        print(f"warning: could not write the failed record of {path} ({type(e).__name__}: {e}); "
              "the copy is kept", file=sys.stderr, flush=True)
        return None
    discard(claimed)
    return written


def recover(where: str, why: str) -> list[Path]:
    """Every copy a dead rank left in `where` becomes a failed record, named by `why`."""
    return [rec for p in sorted(Path(where).glob(f"*{SUFFIX}")) if (rec := finish(p, why)) is not None]


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), so a reused pid is not taken for it."""
    fields = procstat.fields(pid)
    if fields is None:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]  # a zombie has died already


def _pid_space() -> str | None:
    """One kernel and one pid namespace: where another process's pid means the same process."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() + os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def writer(path: Path | None) -> dict[str, Any] | None:
    """What the other ranks need to finish the writer's copy: its pid, host and the copy's
    path (`planned`: told before the copy is written). None where a launcher finishes copies
    (it also knows how the rank died) or there will be no copy."""
    if path is None or os.environ.get(INFLIGHT_ENV):
        return None
    pid = os.getpid()
    return {"pid": pid, "start": _start_time(pid), "host": socket.gethostname(), "space": _pid_space(),
            "path": str(path)}


def _gone(who: dict[str, Any], wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while _start_time(who["pid"]) == who["start"]:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def _signals_held():
    """SIGTERM and SIGINT wait until the record is written: torchrun's agent SIGTERMs the
    surviving ranks right after rank 0 dies, and ours raises (signals._on_sigterm). A handler
    that only notes the signal, not a blocked mask: torch's own threads would still take it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; signals are the main thread's anyway
        return
    before, noted = signals.hold((signal.SIGTERM, signal.SIGINT))
    try:
        yield
    finally:
        signals.release(before, noted)  # now the real handler runs (Terminated, exit 143)


def after_writer_died(who: dict[str, Any] | None, rank: int, exc: BaseException) -> Path | None:
    """On a non-writing rank whose part of the point failed with `exc`: if the writing rank
    shares this host's pids and has died, its copy becomes the point's failed record."""
    if who is None or who["space"] is None or who["space"] != _pid_space():
        return None  # another host: its pid tells nothing here
    with _signals_held():
        if not _gone(who, DEATH_WAIT_S):
            return None  # alive: it writes its own record
        what = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}" if str(exc).strip() \
            else type(exc).__name__
        why = (f"rank 0 (pid {who['pid']} on {who['host']}) died during this point without writing its record "
               f"(killed, e.g. SIGKILL or the OOM killer, or crashed); rank {rank} then got {what}")
        path = finish(Path(who["path"]), why)
        if path is not None:
            print(f"error: rank 0 (pid {who['pid']}) died during this point; rank {rank} wrote its failed "
                  f"record: {path}", file=sys.stderr, flush=True)
    return path
