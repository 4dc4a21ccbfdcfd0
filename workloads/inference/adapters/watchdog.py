"""Run a server command and take its whole process group down when our parent dies.

    python -m workloads.inference.adapters.watchdog <parent pid> <grace s> -- argv...

The orchestrator starts every engine through this, in a session of its own. If the
load generator is SIGKILLed (or crashes) it cannot stop its server; this process
notices (its parent pid changes) and TERMs the group, then KILLs it after the grace
period. A PR_SET_PDEATHSIG would fire when the parent *thread* that forked us exits,
and would only reach one process, not torchrun's ranks or vLLM's workers, so the group
is watched by polling instead. The exit status mirrors the command's (a signal death is
re-raised), so the orchestrator can say how the server died. torchrun puts each rank in a
session of its own, so "the group" here is the group plus every descendant; the watchdog is
their subreaper, so a rank whose torchrun died is still found.

Our stdout is the server log. The engine's output reaches it through us, redacted (a
traceback an engine prints may hold an HF token, an --api-key, or the value of any
secret-named variable in its environment): a reader thread copies it as it comes, whole
lines at a time, so the parent-death polling stays responsive and the engine's last lines
are in the log when it dies (the orchestrator quotes the log's tail in its errors).
"""

from __future__ import annotations

import codecs
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from workloads.core import procstat
from workloads.core.redact import redact_text, secret_values

POLL_S = 0.2
_PR_SET_CHILD_SUBREAPER = 36
# A line longer than this (a progress bar redrawn without a newline) is written as it stands.
MAX_LINE = 1 << 16
# After the engine exits, how long its output may still take to reach the log: what it wrote
# is already in the pipe; a descendant that outlives it and holds the pipe is not waited for.
DRAIN_S = 2.0
_LOG = threading.Lock()  # our own lines and the engine's never interleave mid-line


def log(text: str) -> None:
    """Write `text` to the server log (our stdout), whole and at once."""
    with _LOG:
        sys.stdout.buffer.write(text.encode("utf-8", "replace"))
        sys.stdout.buffer.flush()


def relay(src, secrets: list[str]) -> None:
    """Copy the engine's output from pipe `src` to the log, redacted, until end of file.

    Only whole lines (ended by a newline or a carriage return) are redacted and written, so a
    credential split across two reads is still seen whole; bytes that are not UTF-8 become
    U+FFFD rather than stopping the copy."""
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    pending = ""
    while chunk := os.read(src.fileno(), 65536):
        pending += decode(chunk)
        end = max(pending.rfind("\n"), pending.rfind("\r")) + 1
        if end == 0 and len(pending) > MAX_LINE:
            end = len(pending)
        if end:
            log(redact_text(pending[:end], secrets))
            pending = pending[end:]
    pending += decode(b"", final=True)
    if pending:
        log(redact_text(pending, secrets))  # the last words, even without their newline


def family(root: int) -> set[int]:
    """Living processes in root's process group or below root in the process tree."""
    parent, group = {}, set()
    for d in Path("/proc").glob("[0-9]*"):
        f = procstat.fields(int(d.name))
        if f and f[0] != "Z":
            parent[int(d.name)] = int(f[1])
            if int(f[2]) == root:
                group.add(int(d.name))
    out = set(group)
    for pid in parent:
        p = pid
        while p > 1 and p not in out and p != root:
            p = parent.get(p, 0)
        if p == root or p in out:
            out.add(pid)
    return out | ({root} if root in parent else set())


def signal_all(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _mirror(code: int) -> None:
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    sys.exit(code if code >= 0 else 128 - code)


def _reap_group(grace_s: float, copier: threading.Thread) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    me = os.getpid()
    doomed = family(me) - {me}
    signal_all(doomed, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and family(me) - {me}:
        time.sleep(POLL_S)
    signal_all((doomed | family(me)) - {me}, signal.SIGKILL)
    copier.join(DRAIN_S)  # what the engine said while stopping
    sys.exit(1)


def _forked(argv: list[str]) -> subprocess.Popen | None:
    """The engine forked from this watchdog when the load generator forked it warm (forkstart.py)."""
    if "torch" not in sys.modules:  # exec'd: nothing warm to fork from
        return None
    from workloads.inference.adapters import forkstart

    child = forkstart.engine(argv)
    if child is not None:
        log(f"watchdog: {argv[2]} {argv[3]} forked from the warm load generator (pid {child.pid}), "
            "not a fresh interpreter\n")
    return child


def main(argv: list[str]) -> None:
    parent, grace_s, argv = int(argv[0]), float(argv[1]), argv[argv.index("--") + 1:]
    if os.getppid() != parent:
        sys.exit("watchdog: the load generator is already gone")
    # A group-wide SIGTERM (the orchestrator's stop) reaches the command too; wait for it.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        child = _forked(argv) or subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError:
        print(f"watchdog: {argv[0]!r} is not installed", file=sys.stderr, flush=True)
        sys.exit(127)
    # The child's environment is ours: the values of its secret-named variables are hidden too.
    copier = threading.Thread(target=relay, args=(child.stdout, secret_values(os.environ)), daemon=True)
    copier.start()
    while True:
        try:
            code = child.wait(POLL_S)
            copier.join(DRAIN_S)  # its last lines (a traceback) reach the log before its exit is told
            _mirror(code)
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            log(f"watchdog: the load generator (pid {parent}) died; stopping the server\n")
            _reap_group(grace_s, copier)


if __name__ == "__main__":
    main(sys.argv[1:])
