"""How long this process (and the server it measures) waited for a core while a timing test
ran, from the kernel's own scheduler statistics (/proc/<pid>/task/*/schedstat: time spent
runnable on a run queue, and how many times it got a core).

A timing test that compares a client's clock readings with a server's must allow for the time
between the server's write and the client's wake-up: ~0.05 ms on a quiet machine, several ms
when other jobs share the cores, changing from one second to the next. Tests derive their
margins from this measurement, taken over the test itself (and print it), instead of fixing
milliseconds that hold only on an idle machine.

    with Jitter() as j:
        ...the timed work...
    tol = max(1e-3, 4 * j.mean_wait_s)

(Why not a probe of our own, a socket written by one process and read by another: a reader
that does nothing else is favoured by the scheduler and saw 0.1 ms where the busy client was
late by 3 ms; a reader thread inside the client waits for the GIL and saw 200 ms.)
"""

from __future__ import annotations

from pathlib import Path


def _schedstat(pids: tuple[int, ...]) -> tuple[int, int]:
    """(ns waited on a run queue, times run) summed over the threads of this process and `pids`."""
    wait = runs = 0
    for task in (t for pid in ("self", *pids) for t in Path(f"/proc/{pid}/task").iterdir()):
        try:
            _, w, n = map(int, (task / "schedstat").read_text().split())
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        wait, runs = wait + w, runs + n
    return wait, runs


class Jitter:
    """The block's mean wait for a core per time this process (and `pids`, the server's) got
    one: what a wake-up on a chunk's arrival costs on this machine, now. (Threads that end
    inside the block take their counts with them; the client's are the main thread's.)"""

    def __init__(self, *pids: int):
        self.pids = pids

    def __enter__(self) -> "Jitter":
        self._start = _schedstat(self.pids)
        return self

    def __exit__(self, *exc) -> None:
        wait, runs = _schedstat(self.pids)
        self.waited_s = (wait - self._start[0]) / 1e9
        self.runs = runs - self._start[1]
        self.mean_wait_s = self.waited_s / self.runs if self.runs > 0 else 0.0

    def __str__(self) -> str:
        return (f"client and server waited {self.waited_s * 1e3:.1f} ms for a core over {self.runs} runs "
                f"(mean {self.mean_wait_s * 1e3:.3f} ms)")
