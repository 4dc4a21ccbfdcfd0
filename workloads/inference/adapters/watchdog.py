"""Run a server command and take its whole process group down when our parent dies.

    python -m workloads.inference.adapters.watchdog <parent pid> <grace s> -- argv...

The orchestrator starts every engine through this, in a session of its own. If the
load generator is SIGKILLed (or crashes) it cannot stop its server; this process
notices (its parent pid changes) and TERMs the group, then KILLs it after the grace
period. A PR_SET_PDEATHSIG would fire when the parent *thread* that forked us exits,
and would only reach one process, not torchrun's ranks or vLLM's workers, so the group
is watched by polling instead. The exit status mirrors the command's (a signal death is
re-raised), so the orchestrator can say how the server died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2


def _mirror(code: int) -> None:
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    sys.exit(code if code >= 0 else 128 - code)


def _reap_group(grace_s: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    time.sleep(grace_s)
    os.killpg(0, signal.SIGKILL)  # ourselves included


def main(argv: list[str]) -> None:
    parent, grace_s, argv = int(argv[0]), float(argv[1]), argv[argv.index("--") + 1:]
    if os.getppid() != parent:
        sys.exit("watchdog: the load generator is already gone")
    # A group-wide SIGTERM (the orchestrator's stop) reaches the command too; wait for it.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = subprocess.Popen(argv)
    except FileNotFoundError:
        print(f"watchdog: {argv[0]!r} is not installed", file=sys.stderr, flush=True)
        sys.exit(127)
    while True:
        try:
            code = child.wait(POLL_S)
            _mirror(code)
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            print(f"watchdog: the load generator (pid {parent}) died; stopping the server", flush=True)
            _reap_group(grace_s)


if __name__ == "__main__":
    main(sys.argv[1:])
